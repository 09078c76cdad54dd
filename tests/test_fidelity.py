"""Behaviour pinned against the original framework's documentation, where a port most easily drifts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, tool
from picoflow.errors import public_message
from tests.support.engine import call, scripted_engine, text


class NoArgs(BaseModel):
    pass


class LegacyStep(Step):
    returned: Any = None

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="pick", description="Pick", schema=NoArgs)]

    @tool
    async def pick(self, args: dict) -> Any:
        return LegacyStep.returned


class LegacyFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [LegacyStep(self)]


async def test_a_handler_returning_a_plain_object_fails_and_says_what_to_return():
    LegacyStep.returned = {"step": "LegacyStep", "state": {"picked": True}}
    engine, _ = scripted_engine([LegacyFlow], [call(("pick", {}))])
    response = await engine.run("LegacyFlow", "pick one")
    assert (response.error_code, response.message) == ("TURN_FAILED", public_message("TURN_FAILED"))
    assert "LegacyStep.pick' returned a dict" in response.detail and "go(Step)" in response.detail


async def test_a_handler_returning_none_is_no_transition():
    LegacyStep.returned = None
    engine, _ = scripted_engine([LegacyFlow], [call(("pick", {})), text("picked")])
    response = await engine.run("LegacyFlow", "pick one")
    assert (response.success, response.message) == (True, "picked")
