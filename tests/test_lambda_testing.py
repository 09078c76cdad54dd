"""The public testing helpers for the Lambda handler, and tool arguments declared under an alias."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, Field

import handlers.api as api
from picoflow import Flow, ModelSelection, Step, ToolSpec, direct, tool
from picoflow.aws.testing import FakeLambdaContext, invoke, reset_runtime, scripted_calls
from picoflow.errors import PicoFlowError
from tests.support.engine import call, scripted_engine

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


def test_the_fake_context_is_a_powertools_lambda_context_with_distinct_request_ids() -> None:
    first, second = FakeLambdaContext(), FakeLambdaContext(timeout_ms=1_000)
    assert isinstance(first, LambdaContext)
    assert first.aws_request_id != second.aws_request_id
    assert first.invoked_function_arn.endswith(":function:picoflow-api")
    assert 0 < second.get_remaining_time_in_millis() <= 1_000
    assert first.tenant_id is None


def test_reset_runtime_builds_the_handler_anew_from_a_changed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.delenv("PICOFLOW_SCRIPT", raising=False)
    monkeypatch.setenv("PICOFLOW_FLOWS", "flows.invoice")
    reset_runtime()
    try:
        assert invoke(api.lambda_handler, "GET", "/ai/flows").json() == ["InvoiceFlow"]
        with pytest.raises(PicoFlowError, match="no scripted model"):
            scripted_calls()
        monkeypatch.setenv("PICOFLOW_FLOWS", "flows.hotel")
        assert invoke(api.lambda_handler, "GET", "/ai/flows").json() == ["InvoiceFlow"]  # kept until reset
        script = tmp_path / "script.json"
        script.write_text(json.dumps([{"content": "Hello there."}]))
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
        reset_runtime()
        assert invoke(api.lambda_handler, "GET", "/ai/flows").json() == ["HotelFlow"]
        result = invoke(api.lambda_handler, "POST", "/ai/run", body={"flowName": "HotelFlow", "message": "Hi"})
        assert result.status == 200 and result.json()["message"] == "Hello there."
        assert result.session == result.json()["session"]
        [received] = scripted_calls()
        assert any(message.content == "Hi" for message in received)
    finally:
        reset_runtime()


class Capture(BaseModel):
    record: dict[str, Any] = Field(alias="json", description="The captured record")
    kind: str = Field(alias="class")


class AliasStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [*super().define_tools(), ToolSpec(name="capture_plain", description="Capture (dict)", schema=Capture)]

    @tool
    async def capture_typed(self, args: Capture) -> Any:
        """Capture, typed."""
        return direct({"typed": args.record, "kind": args.kind})

    @tool
    async def capture_plain(self, args: dict[str, Any]) -> Any:
        return direct({"plain": args})


class AliasFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [AliasStep(self)]


@pytest.mark.parametrize(("tool_name", "expected"), [
    ("capture_typed", {"typed": {"a": 1}, "kind": "x"}),
    ("capture_plain", {"plain": {"json": {"a": 1}, "class": "x"}}),
])
async def test_tool_arguments_under_an_alias_are_offered_and_handled_by_that_name(
    tool_name: str, expected: dict[str, Any]
) -> None:
    engine, provider = scripted_engine([AliasFlow], [call((tool_name, {"json": {"a": 1}, "class": "x"}))])

    response = await engine.run("AliasFlow", "Go")

    assert response.success, response.message
    assert json.loads(response.message) == expected
    assert set(provider.tools[0]) == {"capture_typed", "capture_plain"}
    # What bind_tools receives: the aliases are the argument names the model is shown.
    parameters = ToolSpec(name="capture", description="d", schema=Capture).as_model_tool()["function"]["parameters"]
    assert set(parameters["properties"]) == {"json", "class"}
    assert parameters["properties"]["json"]["description"] == "The captured record"
