"""The GenAI spans' names and values against the ``opentelemetry-semantic-conventions`` package: provider names
(Azure's included), the response id and model, the server address, the tool type, and the provider on a logic
step's span."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import server_attributes
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, stay, telemetry, tool
from picoflow.authoring.step import LogicStep
from picoflow.models.openai import OPENAI_COMPATIBLE
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.test_tracing import exported, ours  # noqa: F401 - exported is a fixture

KNOWN = {member.value for member in gen_ai.GenAiProviderNameValues}


def test_the_attribute_names_are_the_conventions():
    assert telemetry.PROVIDER == gen_ai.GEN_AI_PROVIDER_NAME
    assert telemetry.RESPONSE_ID == gen_ai.GEN_AI_RESPONSE_ID
    assert telemetry.RESPONSE_MODEL == gen_ai.GEN_AI_RESPONSE_MODEL
    assert telemetry.TOOL_TYPE == gen_ai.GEN_AI_TOOL_TYPE
    assert telemetry.TOOL_NAME == gen_ai.GEN_AI_TOOL_NAME
    assert telemetry.SERVER_ADDRESS == server_attributes.SERVER_ADDRESS


@pytest.mark.parametrize(
    ("provider", "expected"),
    [("openai", "openai"), ("azure-openai", "azure.ai.openai"), ("anthropic", "anthropic"),
     ("bedrock", "aws.bedrock"), ("google", "gcp.gen_ai"), ("deepseek", "deepseek")],
)
def test_built_in_providers_report_the_conventions_names(provider: str, expected: str):
    assert telemetry.provider_name(provider) == expected and expected in KNOWN


def test_every_openai_family_member_the_conventions_know_is_named_as_they_do():
    for name in OPENAI_COMPATIBLE:
        reported = telemetry.provider_name(name)
        assert reported in KNOWN or not any(reported.split(".")[0] in value for value in KNOWN), (name, reported)


def test_server_address_follows_the_endpoint():
    assert telemetry.server_address("openai", {}) == "api.openai.com"
    assert telemetry.server_address("openai", {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"}) == "127.0.0.1"
    assert telemetry.server_address("azure-openai", {"AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com/"}) == (
        "x.openai.azure.com"
    )
    assert telemetry.server_address("bedrock", {"AWS_REGION": "eu-west-1"}) == "bedrock-runtime.eu-west-1.amazonaws.com"
    assert telemetry.server_address("ollama", {}) is None


class Order(BaseModel):
    order: str


class LookupStep(Step):
    def get_prompt(self) -> str:
        return "Look orders up."

    @tool
    async def lookup(self, args: Order) -> Any:
        """Look an order up."""
        return stay("found")


class RouteStep(LogicStep):
    async def run_logic(self) -> Any:
        return LookupStep


class SpanFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [RouteStep(self), LookupStep(self)]


async def test_a_turns_spans_carry_the_response_server_tool_type_and_provider(
    exported: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch  # noqa: F811 - the fixture
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    metadata = {"id": "chatcmpl-42", "model_name": "gpt-4o", "finish_reason": "stop"}
    replies = [
        {"tool_calls": [{"name": "lookup", "args": {"order": "A1"}, "id": "call-1"}], "response_metadata": metadata},
        {"content": "Found it.", "response_metadata": metadata},
    ]
    engine = FlowEngine([SpanFlow], MemorySessionStore(), ProviderRegistry(override=ScriptedProvider(replies)))
    response = await engine.run("SpanFlow", "where is A1?")
    assert response.success, response.message
    spans = ours(list(exported.get_finished_spans()))
    chats = [span for span in spans if span.attributes.get(gen_ai.GEN_AI_OPERATION_NAME) == "chat"]
    assert chats
    for span in chats:
        # The response's model is reported even when it is the one requested.
        assert span.attributes[gen_ai.GEN_AI_RESPONSE_MODEL] == "gpt-4o"
        assert span.attributes[gen_ai.GEN_AI_RESPONSE_ID] == "chatcmpl-42"
        assert span.attributes[server_attributes.SERVER_ADDRESS] == "api.openai.com"
    (tool_span,) = [span for span in spans if span.attributes.get(gen_ai.GEN_AI_OPERATION_NAME) == "execute_tool"]
    assert tool_span.attributes[gen_ai.GEN_AI_TOOL_TYPE] == "function"
    agents = {span.attributes[gen_ai.GEN_AI_AGENT_NAME]: span for span in spans
              if span.attributes.get(gen_ai.GEN_AI_OPERATION_NAME) == "invoke_agent"}
    assert agents["RouteStep"].attributes[gen_ai.GEN_AI_PROVIDER_NAME] == "openai"
    assert gen_ai.GEN_AI_REQUEST_MODEL not in agents["RouteStep"].attributes  # a logic step requests no model
    assert agents["LookupStep"].attributes[gen_ai.GEN_AI_REQUEST_MODEL] == "gpt-4o"
