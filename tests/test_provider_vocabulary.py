"""Each provider owns its words for refusals, throttling and configuration faults, and the turn reads an answer or
an error in the words of the provider that served the call; the step's answer is a reply or a route by type."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage

from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.authoring.step_registry import collect_steps
from picoflow.authoring.transitions import Transition
from picoflow.errors import ModelAuthFailedError, ModelNotConfiguredError
from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.bedrock import BedrockProvider
from picoflow.models.google import GoogleProvider
from picoflow.models.openai import OpenAIProvider
from picoflow.models.refusals import configuration_error
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.models.vocabulary import Vocabulary
from picoflow.stores import MemorySessionStore
from picoflow.turn.cursor import Reply, Route, read_answer

OPENAI, ANTHROPIC = OpenAIProvider.vocabulary, AnthropicProvider.vocabulary
GOOGLE, BEDROCK = GoogleProvider.vocabulary, BedrockProvider.vocabulary


def answer(metadata: dict[str, Any], **kwargs: Any) -> AIMessage:
    return AIMessage(content="", response_metadata=metadata, additional_kwargs=kwargs)


@pytest.mark.parametrize(
    ("vocabulary", "message", "reason"),
    [
        (OPENAI, answer({"finish_reason": "content_filter"}), "content_filter"),
        (OPENAI, answer({}, refusal="I must decline."), "refusal"),
        (OPENAI, answer({"finish_reason": "SAFETY"}), None),
        (GOOGLE, answer({"finish_reason": "SAFETY"}), "safety"),
        (GOOGLE, answer({"prompt_feedback": {"block_reason": "OTHER"}}), "other"),
        (GOOGLE, answer({"finish_reason": "content_filter"}), None),
        (ANTHROPIC, answer({"stop_reason": "refusal"}), "refusal"),
        (ANTHROPIC, answer({"stop_reason": "end_turn"}), None),
        (BEDROCK, answer({"stopReason": "guardrail_intervened"}), "guardrail_intervened"),
        (BEDROCK, answer({"finish_reason": "safety"}), None),
    ],
)
def test_each_provider_reads_a_refusal_in_its_own_words(
    vocabulary: Vocabulary, message: AIMessage, reason: str | None
) -> None:
    block = vocabulary.blocked_response(message)
    assert (block.reason if block is not None else None) == reason


class BotocoreError(Exception):
    """The shape of botocore's ClientError: the code sits in the response."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code, "Message": "refused"}}


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class ResourceExhausted(Exception):
    """Google's throttling error, by name."""


def test_throttling_names_belong_to_their_provider_and_429_to_everyone() -> None:
    assert BEDROCK.is_throttling(BotocoreError("ThrottlingException"))
    assert not OPENAI.is_throttling(BotocoreError("ThrottlingException"))
    assert GOOGLE.is_throttling(ResourceExhausted()) and not ANTHROPIC.is_throttling(ResourceExhausted())
    assert all(v.is_throttling(StatusError(429)) for v in (OPENAI, ANTHROPIC, GOOGLE, BEDROCK, Vocabulary()))
    assert not Vocabulary().is_throttling(None)


def test_configuration_codes_belong_to_their_provider_and_http_statuses_to_everyone() -> None:
    denied = BotocoreError("AccessDeniedException")
    auth = configuration_error(denied, "bedrock", "refused", BEDROCK)
    assert isinstance(auth, ModelAuthFailedError) and auth.setting == "the model access of the function's role"
    assert configuration_error(denied, "openai", "refused", OPENAI) is None
    unknown = configuration_error(BotocoreError("ResourceNotFoundException"), "bedrock", "no model", BEDROCK)
    assert type(unknown) is ModelNotConfiguredError and unknown.setting == "the model name"
    for vocabulary in (OPENAI, Vocabulary()):
        assert isinstance(configuration_error(StatusError(401), "any", "x", vocabulary), ModelAuthFailedError)
        assert type(configuration_error(StatusError(404), "any", "x", vocabulary)) is ModelNotConfiguredError


def test_the_scripted_provider_understands_every_built_in_providers_words() -> None:
    scripted = ScriptedProvider.vocabulary
    for vocabulary in (OPENAI, ANTHROPIC, GOOGLE, BEDROCK):
        assert vocabulary.blocked_finish_reasons <= scripted.blocked_finish_reasons
        assert vocabulary.throttling_names <= scripted.throttling_names
        assert set(vocabulary.auth_codes) <= set(scripted.auth_codes)
    assert scripted.prompt_feedback_key == "prompt_feedback" and scripted.refusal_key == "refusal"


def test_the_registry_answers_the_vocabulary_of_the_provider_serving_a_selection() -> None:
    bedrock = BedrockProvider(region="eu-west-1")
    registry = ProviderRegistry([bedrock, OpenAIProvider()])
    assert registry.vocabulary(ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0")) is BEDROCK
    assert registry.vocabulary(ModelSelection(provider="openai", name="gpt-4o")) is OPENAI
    served = ProviderRegistry([bedrock], override=ScriptedProvider([]))
    assert served.vocabulary(ModelSelection(provider="bedrock", name="x")) is ScriptedProvider.vocabulary


# -- the turn asks the provider that served the call -----------------------------------------------------------

POLICY_STOP = {"content": "half an answer", "response_metadata": {"finish_reason": "policy_stop"}}
SEEN: list[str] = []


class GatewayProvider(ScriptedProvider):
    """A gateway whose own filter ends a stopped reply with finish reason ``policy_stop``."""

    vocabulary = Vocabulary(blocked_finish_reasons=frozenset({"policy_stop"}))


class PlainProvider(ScriptedProvider):
    """A provider that declares no words of its own."""

    vocabulary = Vocabulary()


class AskStep(Step):
    async def on_llm_blocked(self, context: Any) -> Any:
        SEEN.append(context.reason)
        return "Let us talk about something else."


class GatewayFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="gateway", name="any")

    def define_steps(self) -> list[Step]:
        return [AskStep(self)]


async def run_with(provider: ModelProvider) -> str:
    SEEN.clear()
    engine = FlowEngine(flows=[GatewayFlow], session_store=MemorySessionStore(),
                        providers=ProviderRegistry(override=provider), retry_delay=0)
    response = await engine.run("GatewayFlow", "hi")
    assert response.success, response
    return str(response.message)


async def test_a_finish_reason_is_a_refusal_only_in_the_words_of_the_provider_that_served_the_call() -> None:
    assert await run_with(GatewayProvider([POLICY_STOP])) == "Let us talk about something else."
    assert SEEN == ["policy_stop"]
    assert await run_with(PlainProvider([POLICY_STOP])) == "half an answer"
    assert SEEN == []


# -- a step's answer: a reply or a route, by type ---------------------------------------------------------------


class OtherStep(Step):
    pass


class RoutingFlow(Flow):
    def define_steps(self) -> list[Step]:
        return [AskStep(self), OtherStep(self)]


def test_a_string_routes_only_when_it_names_a_step_and_is_not_the_models_own_words() -> None:
    flow = RoutingFlow()
    collect_steps(flow)
    assert read_answer(flow, "hello") == Reply("hello")
    route = read_answer(flow, "OtherStep")
    assert isinstance(route, Route) and route.transition.step == "OtherStep"
    assert read_answer(flow, "OtherStep", model_said="OtherStep") == Reply("OtherStep")
    assert read_answer(flow, {"total": 3}) == Reply('{"total": 3}')
    assert isinstance(read_answer(flow, Transition(step="OtherStep")), Route)
