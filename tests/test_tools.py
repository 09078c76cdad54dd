"""Tool definitions, exposure, decorator rules, inheritance and dispatch precedence."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, go, tool, tools
from picoflow.authoring.step_registry import collect_steps
from picoflow.authoring.step_tools import group_handler, offered_tool_names, tool_handler
from picoflow.errors import PicoFlowError


class Args(BaseModel):
    value: int = 0


def spec(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=f"{name} tool", schema=Args)


class BaseToolStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [spec("alpha"), spec("beta")]

    @tool
    async def alpha(self, args: dict) -> object:
        return "base-alpha"

    @tool("beta")
    async def handle_beta(self, args: dict) -> object:
        return "base-beta"


class ChildToolStep(BaseToolStep):
    def define_tools(self) -> list[ToolSpec]:
        return [*super().define_tools(), spec("gamma")]

    def use_tools(self) -> list[str]:
        return ["shared"]

    async def alpha(self, args: dict) -> object:  # redeclared without decorating: still the handler
        return "child-alpha"

    @tool("beta")
    async def other_beta(self, args: dict) -> object:  # shadows the parent's registration
        return "child-beta"

    @tool
    async def gamma(self, args: dict) -> object:
        return go(BaseToolStep)


class ToolFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_tools(self) -> list[ToolSpec]:
        return [spec("shared")]

    def define_steps(self) -> list[Step]:
        return [ChildToolStep(self)]


def make_flow(cls: type[Flow] = ToolFlow) -> Flow:
    flow = cls()
    collect_steps(flow)
    return flow


async def test_exposure_is_use_tools_then_decorated_names_base_first():
    flow = make_flow()
    step = flow.require_step(ChildToolStep)
    assert offered_tool_names(step) == ["shared", "alpha", "beta", "gamma"]
    assert {name: flow.get_tool(name) is not None for name in ["shared", "alpha", "gamma", "nope"]} == {
        "shared": True, "alpha": True, "gamma": True, "nope": False,
    }


async def test_dispatch_prefers_the_nearest_registration_and_redeclared_methods():
    step = make_flow().require_step(ChildToolStep)
    assert await tool_handler(step, "alpha")({}) == "child-alpha"
    assert await tool_handler(step, "beta")({}) == "child-beta"
    assert tool_handler(step, "shared") is None
    assert tool_handler(step, "nothing") is None


def test_flow_and_step_definitions_merge_and_duplicates_are_refused():
    class DupStep(Step):
        def define_tools(self) -> list[ToolSpec]:
            return [spec("shared")]

    class DupFlow(ToolFlow):
        def define_steps(self) -> list[Step]:
            return [DupStep(self)]

    with pytest.raises(PicoFlowError, match="Duplicate tool 'shared' registered in flow 'DupFlow'."):
        make_flow(DupFlow)


def test_exposing_an_undefined_tool_is_refused():
    class GhostStep(Step):
        def use_tools(self) -> list[str]:
            return ["ghost"]

    class GhostFlow(ToolFlow):
        def define_steps(self) -> list[Step]:
            return [GhostStep(self)]

    with pytest.raises(PicoFlowError, match="Tool 'ghost' is not defined in flow 'GhostFlow'."):
        make_flow(GhostFlow)


def test_decorator_misuse_is_reported():
    with pytest.raises(PicoFlowError, match="non-empty tool name"):
        tool("  ")
    with pytest.raises(PicoFlowError, match="at least one tool name"):
        tools([])
    with pytest.raises(PicoFlowError, match="more than once"):
        tools(["a", "a"])
    with pytest.raises(PicoFlowError, match="non-empty tool names"):
        tools(["a", ""])
    with pytest.raises(PicoFlowError, match="already handled by method"):

        class Twice(Step):
            @tool("x")
            async def one(self, args: dict) -> None: ...

            @tool("x")
            async def two(self, args: dict) -> None: ...

        from picoflow.authoring.step_tools import decorated_tools

        decorated_tools(Twice)


def test_group_handlers_match_the_exact_name_set_in_any_order():
    class GroupStep(Step):
        @tools(["b", "a"])
        async def both(self, calls: list) -> object:
            return "x"

    step = GroupStep(make_flow())
    assert group_handler(step, {"a", "b"}).__name__ == "both"
    assert group_handler(step, {"a"}) is None


def test_tool_spec_needs_a_pydantic_schema_and_describes_itself():
    with pytest.raises(PicoFlowError):
        ToolSpec(name="x", description="d", schema=dict)
    described = spec("alpha").as_model_tool()
    assert described["function"]["name"] == "alpha"
    assert described["function"]["parameters"]["properties"]["value"]["type"] == "integer"


def test_duplicate_steps_and_empty_registries_are_refused():
    class TwiceFlow(ToolFlow):
        def define_steps(self) -> list[Step]:
            return [ChildToolStep(self), ChildToolStep(self)]

    with pytest.raises(PicoFlowError, match="registered twice"):
        make_flow(TwiceFlow)
