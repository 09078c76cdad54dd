"""The authoring surface: the names a step module needs come from ``picoflow``, and step modules may refer to
each other without importing each other at run time."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import langchain_core.messages

import picoflow
from picoflow import BaseMessage, Flow, ModelSelection, Step, Transition, go, tool
from picoflow.messages import HumanMessageEx
from tests.support.engine import call, scripted_engine, text


class OpeningStep(Step):
    def get_prompt(self) -> str:
        return "Welcome the user; move on when asked."

    @tool
    async def move_on(self) -> Any:
        """Move on to the quiet step."""
        return go(QuietStep).with_message(HumanMessageEx(self, "The user wants to move on."))


class QuietStep(Step):
    seen: list[str] = []

    def get_prompt(self) -> str:
        return "Say hello quietly."

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        QuietStep.seen.append(f"{prior_step}: {message.content if message is not None else None}")
        return HumanMessageEx(self, f"Arrived from {prior_step}.")


class CrossingFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [OpeningStep(self).use_memory("chat"), QuietStep(self).use_memory("quiet")]


async def test_on_crossing_is_written_with_names_from_picoflow_alone():
    assert BaseMessage is langchain_core.messages.BaseMessage and "BaseMessage" in picoflow.__all__
    QuietStep.seen = []
    engine, model = scripted_engine([CrossingFlow], [call(("move_on", {})), text("hello")])
    response = await engine.run("CrossingFlow", "next please")
    assert response.success and response.message == "hello"
    # with_message(...) reached the destination's on_crossing, whose answer opened its model call.
    assert QuietStep.seen == ["OpeningStep: The user wants to move on."]
    assert model.calls[1][-1].content == "Arrived from OpeningStep."


def test_the_transition_refinements_say_what_they_do_and_where():
    assert "destination step" in Transition.with_state.__doc__
    assert "go(X).with_state(...)`` writes X's state" in Transition.with_state.__doc__
    assert "on_crossing" in Transition.with_message.__doc__
    for name in ("with_tool_feedback", "with_prompt", "with_content_type"):
        assert getattr(Transition, name).__doc__.strip()


PLANS = '''
from __future__ import annotations

from typing import Any

from picoflow import Step, go, tool

from {package}.review import ReviewStep


class PlanStep(Step):
    def get_prompt(self) -> str:
        previous = self.get_state("previous")
        return "Help the user pick a plan." + (f" They had {{previous}} before." if previous else "")

    def catalogue_summary(self) -> str:
        return "gold, silver"

    @tool
    async def pick_gold(self) -> Any:
        """Pick the gold plan."""
        self.save_state({{"plan": "gold"}})
        return go(ReviewStep)
'''

REVIEW = '''
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from picoflow import Step, go, tool

if TYPE_CHECKING:
    from {package}.plans import PlanStep


class ReviewStep(Step):
    def get_prompt(self) -> str:
        plans = cast("PlanStep", self.flow.require_step("PlanStep"))
        return f"Review the elections. Plans on offer: {{plans.catalogue_summary()}}"

    @tool
    async def change_plan(self) -> Any:
        """Go back and choose another plan."""
        chosen = self.flow.get_step_state("PlanStep", "plan")
        return go("PlanStep").with_state({{"previous": chosen}})
'''

FLOW = '''
from __future__ import annotations

from picoflow import Flow, ModelSelection, Step

from {package}.plans import PlanStep
from {package}.review import ReviewStep


class SplitFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [PlanStep(self).use_memory("chat"), ReviewStep(self).use_memory("chat")]
'''


async def test_step_modules_that_refer_to_each_other_import_and_run(tmp_path: Path, monkeypatch: Any):
    package = "split_benefits"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, source in (("plans", PLANS), ("review", REVIEW), ("flow", FLOW)):
        (root / f"{name}.py").write_text(textwrap.dedent(source.format(package=package)))
    monkeypatch.syspath_prepend(str(tmp_path))
    # The review module is imported first: it must not need the plans module at run time.
    importlib.import_module(f"{package}.review")
    flow_cls = importlib.import_module(f"{package}.flow").SplitFlow
    try:
        engine, model = scripted_engine(
            [flow_cls], [call(("pick_gold", {})), text("Gold it is."), call(("change_plan", {})), text("Pick again.")]
        )
        first = await engine.run("SplitFlow", "gold please")
        assert first.message == "Gold it is."
        assert "Plans on offer: gold, silver" in model.calls[1][0].content
        second = await engine.run("SplitFlow", "actually, change it", first.session)
        assert second.message == "Pick again."
        assert model.calls[3][0].content == "Help the user pick a plan. They had gold before."
    finally:
        for module in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[module]
