"""A decision provider chosen by configuration (``PICOFLOW_DECISION_PROVIDERS``) and a flow that asks it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from picoflow import Flow, ModelSelection, Step
from picoflow.authoring.decision import DecisionRequest, DecisionResult
from picoflow.session.document import TokenUsage
from tests.support.decision_flows import RouterStep, SearchStep


class KeywordDecider:
    """Routes on keywords, without a model; every instance built and request received is kept for the tests."""

    built: ClassVar[list[KeywordDecider]] = []

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.spec = environ.get("PICOFLOW_DECISION_PROVIDERS")
        self.requests: list[DecisionRequest] = []
        KeywordDecider.built.append(self)

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        self.requests.append(request)
        label = "search" if "search" in request.state["request"].lower() else "review"
        probabilities = {name: 0.0 for name in ("review", "notice", "search")}
        probabilities[label] = 1.0
        answer = {"choice": label, "probabilities": probabilities, "confidence": 1.0}
        return DecisionResult(answers={"route": answer}, usage=TokenUsage(input_tokens=7, output_tokens=1,
                                                                          total_tokens=8))


def make_decider(environ: Mapping[str, str]) -> KeywordDecider:
    """The factory ``PICOFLOW_DECISION_PROVIDERS`` names."""
    return KeywordDecider(environ)


#: A ready instance, for naming a provider rather than a factory.
READY = KeywordDecider({})


class KeywordRouterFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def config_decision(self) -> dict[str, Any]:
        return {"provider": "keywords", "model": "rules-v1", "timeoutMs": 2000}

    def define_steps(self) -> list[Step]:
        return [RouterStep(self).use_memory("router"), SearchStep(self).use_memory("router")]
