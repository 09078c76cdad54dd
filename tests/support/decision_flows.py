"""A flow whose router is a DecisionStep that answers on its own (and keeps the cursor) or hands over."""

from __future__ import annotations

from typing import Any

from picoflow import DecisionStep, Flow, ModelSelection, Step, direct, direct_to, go
from picoflow.authoring.decision import Choice, DecisionContext, DecisionErrorContext

ROUTE = Choice(criteria={
    "review": "Show the saved criteria without searching",
    "notice": "Ask whether there is any news",
    "search": "Search now",
})


class SearchStep(Step):
    def get_prompt(self) -> str:
        return "Present the hotels that match."


class RouterStep(DecisionStep):
    """Reviews and notices are answered here, without moving the cursor; a search hands over."""

    def define_questions(self) -> dict[str, Any]:
        return {"route": ROUTE}

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        seen = [*(self.get_state("requests") or []), context.request]
        self.save_state({"requests": seen})
        route = answers["route"].choice
        if route == "review":
            return direct_to(RouterStep, f"Saved criteria: Paris, 2 nights (decision {len(seen)}).")
        if route == "notice":
            return direct(f"No news yet (decision {len(seen)}).")
        return go(SearchStep)


class RouterFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [RouterStep(self).use_memory("router"), SearchStep(self).use_memory("router")]


HANDOFF = "A support agent will follow up by email."


class GuardedRouterStep(RouterStep):
    """A router whose decision service may time out, fail or answer garbage: it then hands off and stays."""

    def config_decision(self) -> dict[str, Any]:
        return {"timeoutMs": 300}

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        self.save_state({"unavailable": [*(self.get_state("unavailable") or []), type(error).__name__]})
        return direct_to(GuardedRouterStep, HANDOFF)


class GuardedRouterFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [GuardedRouterStep(self).use_memory("router"), SearchStep(self).use_memory("router")]
