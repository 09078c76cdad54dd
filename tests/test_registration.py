"""A flow's configuration is checked when the engine registers it, not on a user's turn."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, stay, tool, tools
from picoflow.authoring.registration import check_flow_configuration
from picoflow.errors import PicoFlowError
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.engine import scripted_engine, text

MODEL = ModelSelection(provider="scripted", name="m")


class CityArgs(BaseModel):
    city: str


class LookupStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="lookup", description="Look a city up", schema=CityArgs)]

    def use_tools(self) -> list[str]:
        return ["lookup"]


class GreetStep(Step):
    def get_prompt(self) -> str:
        return "Greet the user."


class GreetFlow(Flow):
    def config_model(self) -> ModelSelection:
        return MODEL

    def define_steps(self) -> list[Step]:
        return [GreetStep(self)]


def registry() -> ProviderRegistry:
    return ProviderRegistry([ScriptedProvider([])])


def services() -> dict[str, Any]:
    """What an engine offers the check: its model providers and (none here) decision providers."""
    return {"providers": registry(), "decision_providers": ()}


def flow_of(*steps: type[Step], model: ModelSelection = MODEL, name: str = "CheckedFlow") -> type[Flow]:
    def config_model(self: Flow) -> ModelSelection:
        return model

    def define_steps(self: Flow) -> list[Step]:
        return [step(self) for step in steps]

    return type(name, (Flow,), {"config_model": config_model, "define_steps": define_steps})


def test_a_tool_offered_without_a_handler_fails_the_registration():
    with pytest.raises(PicoFlowError) as raised:
        FlowEngine(flows=[flow_of(LookupStep)], session_store=MemorySessionStore(), providers=registry())
    assert str(raised.value) == (
        "Flow 'CheckedFlow', step 'LookupStep': tool 'lookup' is offered to the model but nothing handles it. "
        "Add a handler to the step (@tool async def lookup(self, args) -> ...) or stop offering it in use_tools()."
    )


def test_a_tool_handled_by_a_group_handler_or_a_same_named_method_registers():
    class NamedStep(LookupStep):
        async def lookup(self, args: dict) -> Any:
            return stay("found")

    class GroupedStep(LookupStep):
        @tools(["lookup"])
        async def look_all_up(self, calls: list) -> Any:
            return stay("found")

    check_flow_configuration(flow_of(NamedStep), **services())
    check_flow_configuration(flow_of(GroupedStep), **services())


def test_a_tool_offered_but_defined_nowhere_fails_the_registration():
    class GhostStep(Step):
        def use_tools(self) -> list[str]:
            return ["ghost"]

        @tool
        async def ghost(self, args: dict) -> Any:
            return None

    with pytest.raises(PicoFlowError) as raised:
        check_flow_configuration(flow_of(GhostStep), **services())
    assert str(raised.value) == (
        "Flow 'CheckedFlow' cannot be registered: Tool 'ghost' is not defined in flow 'CheckedFlow': step "
        "'GhostStep' offers it. Define it with a typed @tool handler or a ToolSpec in define_tools(), or stop "
        "offering it."
    )


def test_a_step_registered_twice_fails_the_registration():
    with pytest.raises(PicoFlowError, match=(
        "Flow 'CheckedFlow' cannot be registered: Step 'GreetStep' is registered twice in flow 'CheckedFlow': "
        r"register it once in define_steps\(\), or subclass it \(with its own id\) for a second role."
    )):
        check_flow_configuration(flow_of(GreetStep, GreetStep), **services())


def test_a_flow_without_a_model_fails_the_registration():
    class Modelless(Flow):
        def define_steps(self) -> list[Step]:
            return [GreetStep(self)]

    with pytest.raises(PicoFlowError, match=r"Flow 'Modelless' cannot be registered: .*config_model\(\)"):
        check_flow_configuration(Modelless, **services())


def test_a_step_model_the_engine_cannot_serve_fails_the_registration_naming_the_step():
    class OtherModelStep(GreetStep):
        def __init__(self, flow: Any) -> None:
            super().__init__(flow)
            self.use_model(ModelSelection(provider="elsewhere", name="big"))

    with pytest.raises(PicoFlowError) as raised:
        check_flow_configuration(flow_of(GreetStep, OtherModelStep), **services())
    assert str(raised.value) == (
        "Flow 'CheckedFlow', step 'OtherModelStep': Model 'elsewhere:big' cannot be used: model provider "
        "'elsewhere' is not registered. Register the model's provider with the engine (FlowEngine(providers=...)) "
        "or choose another model in use_model()."
    )
    with pytest.raises(PicoFlowError, match="Flow 'CheckedFlow': Model 'elsewhere:big' cannot be used"):
        check_flow_configuration(flow_of(GreetStep, model=ModelSelection(provider="elsewhere", name="big")),
                                 **services())


def test_a_failed_registration_registers_nothing():
    engine = FlowEngine(session_store=MemorySessionStore(), providers=registry())
    with pytest.raises(PicoFlowError, match="nothing handles it"):
        engine.register_flows([GreetFlow, flow_of(LookupStep)])
    assert engine.get_flow_names() == []


async def test_a_flow_built_from_the_request_is_checked_on_its_turns_instead():
    class TenantFlow(Flow):
        async def init(self) -> None:
            self.tenant_steps = [GreetStep(self)]

        def config_model(self) -> ModelSelection:
            return MODEL

        def define_steps(self) -> list[Step]:
            # Built in init(): there is nothing to check before a request.
            return self.tenant_steps

    engine, _ = scripted_engine([TenantFlow], [text("Hello!")])
    response = await engine.run("TenantFlow", "hi")
    assert response.success and response.message == "Hello!"
