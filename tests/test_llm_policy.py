"""Model-call policy and recovery: per-attempt timeouts, retry decisions, on_llm_error, fallbacks and refusals."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, finish, go, tool
from picoflow import deadline as deadline_module
from picoflow.authoring.recovery import LlmCallPolicy, is_transient_error, resolve_call_policy, retry_with_model
from picoflow.errors import PicoFlowError, ScriptedModelError, public_message
from picoflow.models.openai import OPENAI_VOCABULARY
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.stores import MemorySessionStore
from tests.support.engine import call, scripted_engine, text

Hook = Callable[[Any], Any] | None
EVENTS: list[tuple[str, Any]] = []

BOOM = {"error": "boom"}
LATE = {"content": "late", "delay": 0.3}
BLOCKED = {"content": "", "response_metadata": {"finish_reason": "content_filter"}}


@pytest.fixture(autouse=True)
def _clear_events():
    EVENTS.clear()


class NoArgs(BaseModel):
    pass


class AskStep(Step):
    policy: dict = {}
    retry: Hook = None
    error: Hook = None
    blocked: Hook = None
    reject = False

    def get_prompt(self) -> str:
        return "Answer the user."

    def config_llm_call_policy(self) -> dict:
        return self.policy

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="lookup", description="Look something up", schema=NoArgs)]

    @tool
    async def lookup(self, args: dict) -> None:
        EVENTS.append(("tool", None))

    def check_response(self, result: Any) -> bool:
        return self.reject

    def should_retry_llm_error(self, context: Any) -> bool | None:
        EVENTS.append(("step.retry", context))
        return self.retry(context) if self.retry else None

    async def on_llm_error(self, context: Any) -> Any:
        EVENTS.append(("step.error", context))
        return self.error(context) if self.error else None

    async def on_llm_blocked(self, context: Any) -> Any:
        EVENTS.append(("step.blocked", context))
        return self.blocked(context) if self.blocked else None


class OtherStep(Step):
    def get_prompt(self) -> str:
        return "Take over."


class PolicyFlow(Flow):
    policy: dict = {}
    model = ModelSelection(provider="scripted", name="primary")
    retry: Hook = None
    error: Hook = None
    blocked: Hook = None

    def config_model(self) -> ModelSelection:
        return self.model

    def config_llm_call_policy(self) -> dict:
        return self.policy

    def define_steps(self) -> list[Step]:
        return [self.ask(self), OtherStep(self)]

    def should_retry_llm_error(self, context: Any) -> bool | None:
        EVENTS.append(("flow.retry", context))
        return self.retry(context) if self.retry else None

    async def on_llm_error(self, context: Any) -> Any:
        EVENTS.append(("flow.error", context))
        return self.error(context) if self.error else None

    async def on_llm_blocked(self, context: Any) -> Any:
        EVENTS.append(("flow.blocked", context))
        return self.blocked(context) if self.blocked else None


def make_flow(step: dict | None = None, **flow: Any) -> type[Flow]:
    ask = type("AskStep", (AskStep,), {k: staticmethod(v) if callable(v) else v for k, v in (step or {}).items()})
    attrs = {k: staticmethod(v) if callable(v) else v for k, v in flow.items()}
    return type("PolicyFlow", (PolicyFlow,), {"ask": ask, **attrs})


async def turn(flow: type[Flow], replies: list, message: str = "hi", **run: Any):
    engine, model = scripted_engine([flow], replies)
    response = await engine.run("PolicyFlow", message, **run)
    return response, model, engine


def events(kind: str) -> list[Any]:
    return [context for name, context in EVENTS if name == kind]


# -- call policy -------------------------------------------------------------------------------


def test_a_step_override_inherits_replaces_or_removes_the_flow_timeout():
    assert resolve_call_policy({}, {}) == LlmCallPolicy(timeout_ms=None)
    assert resolve_call_policy({"timeout_ms": 500}, {}) == LlmCallPolicy(timeout_ms=500)
    assert resolve_call_policy({"timeout_ms": 500}, {"timeout_ms": 90}) == LlmCallPolicy(timeout_ms=90)
    assert resolve_call_policy({"timeout_ms": 500}, {"timeout_ms": None}) == LlmCallPolicy(timeout_ms=None)
    assert resolve_call_policy({}, {"timeout_ms": 70}) == LlmCallPolicy(timeout_ms=70)
    for bad in ({"timeout_ms": 0}, {"timeout_ms": -5}, {"timeout_ms": True}, {"timeout_ms": "5"}, {"timeoutMs": 5}):
        with pytest.raises(PicoFlowError):
            resolve_call_policy(bad, {})
        with pytest.raises(PicoFlowError):
            resolve_call_policy({}, bad)


async def test_the_flow_timeout_bounds_every_attempt():
    started = time.monotonic()
    response, model, _ = await turn(make_flow(policy={"timeout_ms": 40}), [LATE, LATE, LATE])
    assert not response.success
    assert (response.error_code, response.status_code) == ("MODEL_TIMEOUT", 504)
    assert response.message == public_message("MODEL_TIMEOUT")
    assert response.detail == "LLM call failed. Reason:timeout. Error:the model call exceeded 40 ms"
    assert len(model.calls) == 3
    assert time.monotonic() - started < 0.3 * 3
    context = events("flow.error")[0]
    assert (context.kind, context.stopped_because, context.attempts) == ("invocation_error", "attempts_exhausted", 3)
    assert isinstance(context.error, TimeoutError)


@pytest.mark.parametrize("override", [{"timeout_ms": None}, {"timeout_ms": 2000}])
async def test_a_step_can_remove_or_replace_the_flow_timeout(override):
    flow = make_flow({"policy": override}, policy={"timeout_ms": 40})
    response, model, _ = await turn(flow, [LATE])
    assert response.success and response.message == "late"
    assert len(model.calls) == 1


async def test_the_turn_deadline_bounds_the_attempt_timeout(monkeypatch):
    # The handler passes the Lambda's remaining time as the turn deadline; it caps the policy timeout.
    monkeypatch.setattr(deadline_module, "MIN_CALL_SECONDS", 0.05)
    started = time.monotonic()
    response, model, _ = await turn(
        make_flow(policy={"timeout_ms": 60_000}), [{"content": "slow", "delay": 5}, text("never")],
        deadline=time.monotonic() + 0.4,
    )
    assert time.monotonic() - started < 2
    assert (response.error_code, response.status_code) == ("TURN_DEADLINE", 504)
    assert len(model.calls) == 1


# -- invocation errors: retry decisions and recovery -------------------------------------------


async def test_without_hooks_every_configured_attempt_is_used_then_the_error_propagates():
    response, model, _ = await turn(make_flow(), [BOOM, BOOM, BOOM])
    assert not response.success
    assert (response.error_code, response.status_code) == ("MODEL_UNAVAILABLE", 502)
    assert response.message == public_message("MODEL_UNAVAILABLE")
    assert response.detail == "LLM call failed. Reason:error. Error:ScriptedModelError: boom"
    assert len(model.calls) == 3
    # Asked after each failed attempt that still had a successor, step first, then flow.
    assert [name for name, _ in EVENTS] == [
        "step.retry", "flow.retry", "step.retry", "flow.retry", "step.error", "flow.error"
    ]
    first = events("step.retry")[0]
    assert (first.attempt, first.max_attempts, first.step_id, first.model) == (1, 3, "AskStep", "primary")
    assert isinstance(first.error, ScriptedModelError)


@pytest.mark.parametrize(
    ("step_retry", "flow_retry", "attempts"),
    [(lambda c: False, None, 1), (None, lambda c: False, 1), (lambda c: True, lambda c: False, 3), (None, None, 3)],
)
async def test_should_retry_llm_error_asks_the_step_then_the_flow(step_retry, flow_retry, attempts):
    flow = make_flow({"retry": step_retry}, retry=flow_retry)
    response, model, _ = await turn(flow, [BOOM, BOOM, BOOM])
    assert not response.success
    assert len(model.calls) == attempts
    context = events("step.error")[0]
    assert context.stopped_because == ("retry_declined" if attempts == 1 else "attempts_exhausted")
    if step_retry is not None:
        assert events("flow.retry") == []


async def test_on_llm_error_answers_from_the_step_before_the_flow():
    flow = make_flow({"error": lambda c: "step answer"}, error=lambda c: "flow answer")
    response, _, _ = await turn(flow, [BOOM, BOOM, BOOM])
    assert (response.success, response.message) == (True, "step answer")
    assert events("flow.error") == []

    response, _, engine = await turn(make_flow(error=lambda c: "flow answer"), [BOOM, BOOM, BOOM])
    assert (response.success, response.message) == (True, "flow answer")
    doc = await engine.session_store.load(response.session)
    assert doc.flow.memory["AskStep"].messages[-1].content == "flow answer"


async def test_on_llm_error_may_route_or_finish():
    routed = make_flow({"error": lambda c: go(OtherStep)})
    response, model, engine = await turn(routed, [BOOM, BOOM, BOOM, text("taking over")])
    assert (response.success, response.message) == (True, "taking over")
    assert model.calls[-1][0].content == "Take over."
    assert (await engine.session_store.load(response.session)).flow.current_step == "OtherStep"

    finished = make_flow({"error": lambda c: finish("We will call you back.")})
    response, _, _ = await turn(finished, [BOOM, BOOM, BOOM])
    assert (response.success, response.completed, response.message) == (True, True, "We will call you back.")


async def test_empty_and_rejected_responses_reach_on_llm_error_with_their_kind():
    response, model, _ = await turn(make_flow(error=lambda c: "fallback"), [text(""), text(""), text("")])
    assert response.message == "fallback"
    context = events("flow.error")[0]
    assert (context.kind, context.stopped_because) == ("empty_response", "attempts_exhausted")
    assert isinstance(context.last_response, AIMessage)
    # Retrying empty answers is not an invocation error, so should_retry_llm_error is not asked.
    assert events("step.retry") == []

    EVENTS.clear()
    rejecting = make_flow({"reject": True}, error=lambda c: "fallback")
    response, _, _ = await turn(rejecting, [text("a"), text("b"), text("c")])
    context = events("flow.error")[0]
    assert (context.kind, context.last_response.content) == ("response_rejected", "c")


# -- fallback model ----------------------------------------------------------------------------

FALLBACK = ModelSelection(provider="scripted", name="backup")


async def test_retry_with_model_continues_the_step_on_the_fallback_for_this_turn_only():
    flow = make_flow(
        {"error": lambda c: retry_with_model({"provider": "scripted", "name": "backup"})},
        model=ModelSelection(provider="scripted", name="primary", retry_attempts=2),
    )
    replies = [BOOM, BOOM, call(("lookup", {})), text("answered by backup"), text("primary again")]
    engine, model = scripted_engine([flow], replies)
    first = await engine.run("PolicyFlow", "hi")
    assert (first.success, first.message) == (True, "answered by backup")
    # The fallback got one attempt, and the follow-up call after its tool call stayed on it.
    assert [s.name for s in model.selections] == ["primary", "primary", "backup", "backup"]
    assert events("tool") == [None]

    second = await engine.run("PolicyFlow", "again", session_id=first.session)
    assert second.message == "primary again"
    assert model.selections[-1].name == "primary"
    doc = await engine.session_store.load(first.session)
    assert all(step.model is None for step in doc.flow.steps)


async def test_the_fallback_gets_one_attempt_and_a_second_fallback_is_refused():
    def second_chance(context: Any) -> Any:
        return retry_with_model(FALLBACK) if context.model == "primary" else "gave up on " + context.model

    response, model, _ = await turn(make_flow({"error": second_chance}), [BOOM, BOOM, BOOM, BOOM])
    assert response.message == "gave up on backup"
    assert [s.name for s in model.selections] == ["primary"] * 3 + ["backup"]

    response, _, _ = await turn(make_flow({"error": lambda c: retry_with_model(FALLBACK)}), [BOOM] * 4)
    assert not response.success and response.message == public_message(response.error_code)
    assert response.detail == "Step 'AskStep' asked for a second fallback model in one recovery sequence."


def test_a_fallback_selection_may_not_carry_its_own_attempt_budget():
    for selection in (
        {"provider": "scripted", "name": "backup", "retry_attempts": 1},
        {"provider": "scripted", "name": "backup", "retryAttempts": 5},
        ModelSelection(provider="scripted", name="backup", retry_attempts=3),
    ):
        with pytest.raises(PicoFlowError, match="may not set retry_attempts"):
            retry_with_model(selection)
    assert retry_with_model(FALLBACK).selection == FALLBACK


# -- provider refusals -------------------------------------------------------------------------


async def test_a_blocked_candidate_goes_to_on_llm_blocked_without_retry_or_on_llm_error():
    flow = make_flow({"blocked": lambda c: "I can't help with that, but a colleague can."})
    response, model, engine = await turn(flow, [BLOCKED, text("never used")])
    assert (response.success, response.message) == (True, "I can't help with that, but a colleague can.")
    assert len(model.calls) == 1
    assert events("step.error") == [] and events("step.retry") == []
    context = events("step.blocked")[0]
    assert (context.reason, context.raw_reason, context.phase, context.provider) == (
        "content_filter", "content_filter", "candidate", "scripted"
    )
    assert events("flow.blocked") == []
    doc = await engine.session_store.load(response.session)
    assert doc.warn[-1].message == "model call blocked by the provider"


async def test_the_flow_handles_a_block_the_step_declines_and_an_unhandled_block_fails_the_turn():
    response, _, _ = await turn(make_flow(blocked=lambda c: go(OtherStep)), [BLOCKED, text("other step here")])
    assert response.message == "other step here"
    assert len(events("step.blocked")) == len(events("flow.blocked")) == 1

    response, _, _ = await turn(make_flow(), [BLOCKED])
    assert (response.success, response.error_code, response.status_code) == (False, "LLM_BLOCKED", 422)
    assert response.message == public_message("LLM_BLOCKED")
    assert response.detail == "The model provider blocked the candidate of step 'AskStep' (content_filter)."


@pytest.mark.parametrize(
    ("reply", "reason", "phase"),
    [
        ({"content": "", "refusal": "I must decline."}, "refusal", "candidate"),
        ({"content": "", "response_metadata": {"finish_reason": "SAFETY"}}, "safety", "candidate"),
        ({"content": "", "response_metadata": {"prompt_feedback": {"block_reason": "OTHER"}}}, "other", "prompt"),
    ],
)
async def test_refusals_are_recognised_in_their_provider_shapes(reply, reason, phase):
    response, _, _ = await turn(make_flow(blocked=lambda c: "safe"), [reply])
    assert response.message == "safe"
    context = events("flow.blocked")[0]
    assert (context.reason, context.phase) == (reason, phase)


class PromptFiltered(Exception):
    code = "content_filter"


class RefusingProvider(ModelProvider):
    """A provider that refuses the prompt by raising, as OpenAI-compatible content filters do."""

    name = "refusing"
    vocabulary = OPENAI_VOCABULARY

    def chat_model(self, selection: ModelSelection) -> Any:
        async def refuse(_messages: Any) -> Any:
            raise PromptFiltered("the prompt was filtered")

        return RefusingModel(RunnableLambda(refuse))


class RefusingModel:
    def __init__(self, runnable: RunnableLambda) -> None:
        self.runnable = runnable

    def bind_tools(self, _tools: Any) -> RunnableLambda:
        return self.runnable


async def test_a_provider_that_raises_a_content_filter_error_is_a_blocked_prompt():
    engine = FlowEngine(
        flows=[make_flow(blocked=lambda c: "rephrase, please")],
        session_store=MemorySessionStore(),
        providers=ProviderRegistry(override=RefusingProvider()),
        retry_delay=0,
    )
    response = await engine.run("PolicyFlow", "hi")
    assert response.message == "rephrase, please"
    context = events("flow.blocked")[0]
    assert (context.reason, context.phase) == ("content_filter", "prompt")
    assert events("step.retry") == []


class _StatusError(Exception):
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.response = type("Response", (), {"headers": headers or {}})()


class RateLimitError(Exception):
    """Named like the OpenAI SDK's, without a status: the name alone classifies it."""


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (TimeoutError(), True),
        (ConnectionError("reset"), True),
        (_StatusError(408), True),
        (_StatusError(429), True),
        (_StatusError(500), True),
        (_StatusError(503), True),
        (RateLimitError(), True),
        (_StatusError(429, {"x-should-retry": "false"}), False),
        (_StatusError(400), False),
        (_StatusError(401), False),
        (_StatusError(403), False),
        (_StatusError(404), False),
        (_StatusError(422), False),
        (KeyError("k"), False),
        (ValueError("v"), False),
        (PicoFlowError("misconfigured"), False),
        (ClientError({"Error": {"Code": "ThrottlingException"}}, "Converse"), True),
        (ClientError({"Error": {"Code": "ValidationException"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "X"),
         False),
    ],
)
def test_one_classification_decides_what_is_worth_another_attempt(error: BaseException, transient: bool) -> None:
    assert is_transient_error(error) is transient


async def test_a_401_is_not_retried_while_a_503_is() -> None:
    response, model, _ = await turn(make_flow(), [{"error": "bad key", "status": 401}, text("never")])
    assert not response.success and len(model.calls) == 1

    response, model, _ = await turn(make_flow(), [{"error": "busy", "status": 503}, text("after a retry")])
    assert (response.success, response.message) == (True, "after a retry") and len(model.calls) == 2
