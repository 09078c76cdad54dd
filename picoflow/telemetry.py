"""OpenTelemetry spans of a turn, named and attributed after the GenAI semantic conventions.

A turn is an ``invoke_workflow {flow}`` span; inside it every step run is ``invoke_agent {step}``, every model
call ``chat {model}`` (``picoflow.call.purpose`` tells a step's reply from a decision or a compaction summary)
and every tool call ``execute_tool {tool}``. Spans go through the public OpenTelemetry API only: whatever SDK
the process configures (ADOT in Lambda, or any other) receives them; without one they record nothing.

Spans carry names, ids, models, token counts and outcomes. Message text, prompts, tool arguments and tool
results are added only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``; a session is
named by a digest of its id, never by the id itself.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from picoflow.messages import content_text, finish_reason, usage_from_message
from picoflow.models.registry import ModelSelection
from picoflow.results import RunResponse
from picoflow.session.document import TokenUsage

#: Set to ``true`` to record message text, prompts, tool arguments and tool results on the spans.
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
SERVER_ADDRESS = "server.address"
CONVERSATION = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
WORKFLOW_NAME = "gen_ai.workflow.name"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
#: Why a model was called: ``chat`` (a step's reply), ``decision`` (a DecisionStep) or ``summary`` (compaction).
PURPOSE = "picoflow.call.purpose"
STEP = "picoflow.step"
COMPLETED = "picoflow.turn.completed"
DECISION_ROUTE = "picoflow.decision.route"

# The conventions' provider names where PicoFlow's built-in provider names differ from them.
_PROVIDER_NAMES = {
    "bedrock": "aws.bedrock", "google": "gcp.gen_ai", "azure": "azure.ai.openai", "azure-openai": "azure.ai.openai",
}
# Where each built-in provider's requests go unless an endpoint variable says otherwise (``server.address``).
_SERVER_ADDRESSES = {
    "openai": "api.openai.com", "anthropic": "api.anthropic.com", "google": "generativelanguage.googleapis.com",
    "deepseek": "api.deepseek.com", "openrouter": "openrouter.ai",
}
# LangChain's own ids for a message a provider gave none (``run-...``): not the provider's response id.
_LANGCHAIN_IDS = ("run-", "lc_run-")
# Selection parameters that have a request attribute of their own.
_REQUEST_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
}
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}

_tracer = trace.get_tracer("picoflow")


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Send PicoFlow's spans to ``provider`` instead of the process's global one (None: back to the global)."""
    global _tracer
    _tracer = provider.get_tracer("picoflow") if provider is not None else trace.get_tracer("picoflow")


def session_digest(session_id: str) -> str:
    """What telemetry and log lines name a session by: a digest, since the id itself lets its holder continue."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:16]


def capture_content() -> bool:
    """Whether spans may carry message text and tool arguments (the operator's explicit opt-in)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def trace_only_context() -> contextvars.Context:
    """A fresh context holding nothing but the current trace context, for a task that outlives its starter.

    Such a task (an MCP session held open across turns) must not inherit the starter's other context variables,
    a turn's deadline among them; its spans still join the starter's trace, under the span current at the start,
    rather than each becoming the root of a trace of its own.
    """
    fresh = contextvars.Context()
    fresh.run(otel_context.attach, otel_context.get_current())
    return fresh


def provider_name(provider: str) -> str:
    """``gen_ai.provider.name`` for a selection's provider."""
    return _PROVIDER_NAMES.get(provider, provider)


def server_address(provider: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``server.address`` of a built-in provider's requests: the host of its endpoint variable when one is set
    (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, ``AZURE_OPENAI_ENDPOINT`` ...), else its public API's; Bedrock's
    Region endpoint; None for a provider it does not know."""
    env = os.environ if environ is None else environ
    variable = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL", "google": "GOOGLE_BASE_URL",
                "azure-openai": "AZURE_OPENAI_ENDPOINT"}.get(provider)
    configured = (env.get(variable) or "").strip() if variable else ""
    if configured:
        return urlsplit(configured).hostname
    if provider == "bedrock":
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        return f"bedrock-runtime.{region}.amazonaws.com" if region else None
    return _SERVER_ADDRESSES.get(provider)


# -- the turn -------------------------------------------------------------------------------------


@dataclass
class _Turn:
    span: Span
    capture: bool
    conversation: str | None = None
    # Whether the turn's own span has the digest yet: it gets it with the turn's outcome, in one SDK call.
    named: bool = False

    def attributes(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """``attributes`` and the session's digest, for a span of this turn."""
        if self.conversation is not None:
            attributes[CONVERSATION] = self.conversation
        return attributes

    def outcome(self, attributes: dict[str, Any]) -> None:
        """Set ``attributes`` on the turn's span, with the session's digest if the span lacks it."""
        if not self.named and self.conversation is not None:
            attributes[CONVERSATION] = self.conversation
            self.named = True
        if attributes:
            self.span.set_attributes(attributes)


@dataclass(frozen=True)
class _Traced:
    """The turn running in a task and the spans open in its innermost model loop."""

    turn: _Turn | None = None
    runs: _Runs | None = None


# A task outside any traced turn.
_UNTRACED_TASK = _Traced()
# A ContextVar because spans are opened by code the turn does not hand them to (a parallel worker's task, a
# nested step's model loop), each of which must see its own innermost loop.
_traced_now: contextvars.ContextVar[_Traced] = contextvars.ContextVar(
    "picoflow_traced", default=_UNTRACED_TASK
)


def _traced() -> _Turn | None:
    """The running turn when its span records: the spans inside a turn are made only then."""
    running = _traced_now.get().turn
    return running if running is not None and running.span.is_recording() else None


class TurnSpan:
    """The span of one turn; ``answered`` records how the turn ended."""

    def __init__(self, running: _Turn) -> None:
        self.running = running

    def answered(self, response: RunResponse) -> RunResponse:
        running = self.running
        if running.span.is_recording():
            if running.conversation is None and response.session:
                # A turn answered before its session was opened (a replayed receipt, a refused session).
                running.conversation = session_digest(response.session)
            attributes: dict[str, Any] = {COMPLETED: response.completed}
            if not response.success:
                attributes[ERROR_TYPE] = response.error_code or "_OTHER"
                running.span.set_status(Status(StatusCode.ERROR))
            elif running.capture and isinstance(response.message, str):
                reply = {"role": "assistant", "parts": [_text_part(response.message)], "finish_reason": "stop"}
                attributes[OUTPUT_MESSAGES] = _json([reply])
            running.outcome(attributes)
        return response


@contextmanager
def turn(flow_name: str, user_message: str | None) -> Iterator[TurnSpan]:
    """The span of one turn of ``flow_name``, current inside the block; name its session with ``conversation``."""
    span = _tracer.start_span(
        f"invoke_workflow {flow_name}",
        attributes={OPERATION: "invoke_workflow", WORKFLOW_NAME: flow_name, AGENT_NAME: flow_name},
    )
    running = _Turn(span, span.is_recording() and capture_content())
    if running.capture and user_message:
        span.set_attribute(INPUT_MESSAGES, _json([{"role": "user", "parts": [_text_part(user_message)]}]))
    token = _traced_now.set(_Traced(running))
    try:
        with _current(span):
            try:
                yield TurnSpan(running)
            finally:
                if span.is_recording():
                    # A turn that raised was not answered: its span still names its session.
                    running.outcome({})
    finally:
        _traced_now.reset(token)


def conversation(session_id: str) -> None:
    """Name the running turn's session (by its digest) on the turn's span and on every span opened after."""
    running = _traced()
    if running is not None:
        running.conversation = session_digest(session_id)


# -- step runs and their tool calls ---------------------------------------------------------------


class StepLike(Protocol):
    """What a step span reads of a step."""

    @property
    def id(self) -> str: ...

    def is_logic(self) -> bool: ...

    def model_selection(self) -> ModelSelection: ...


class _Runs:
    """The spans open in one model loop: the visited step's, and the running tool call's inside it."""

    def __init__(self) -> None:
        self.step_id: str | None = None
        self.step: Span | None = None
        self.step_token: Token[Context] | None = None
        self.tool: Span | None = None
        self.tool_token: Token[Context] | None = None
        self.capture = False

    def enter(self, step: StepLike) -> None:
        self.close(None)
        self.step_id = step.id
        running = _traced()
        if running is None:
            return
        attributes = running.attributes({OPERATION: "invoke_agent", AGENT_NAME: step.id})
        # A logic step calls no model, but its span names the flow's provider as every invoke_agent span must.
        selection = step.model_selection()
        attributes[PROVIDER] = provider_name(selection.provider)
        if not step.is_logic():
            attributes[REQUEST_MODEL] = selection.name
        self.step = _tracer.start_span(f"invoke_agent {step.id}", attributes=attributes)
        self.step_token = otel_context.attach(trace.set_span_in_context(self.step))

    def start_tool(self, running: _Turn, call: Mapping[str, Any]) -> None:
        # Every tool a step offers is a function the model calls (MCP tools included, as the step offers them).
        attributes = running.attributes({OPERATION: "execute_tool", TOOL_NAME: call["name"], TOOL_TYPE: "function"})
        if call.get("id"):
            attributes[TOOL_CALL_ID] = call["id"]
        if running.capture:
            attributes[TOOL_ARGUMENTS] = _json(call.get("args") or {})
        span = _tracer.start_span(f"execute_tool {call['name']}", attributes=attributes)
        self.tool, self.tool_token = span, otel_context.attach(trace.set_span_in_context(span))
        self.capture = running.capture

    def end_tool(self, result: BaseMessage | None, error: BaseException | None = None) -> None:
        span, self.tool = self.tool, None
        if span is None:
            return
        if self.tool_token is not None:
            otel_context.detach(self.tool_token)
            self.tool_token = None
        if error is not None:
            _failed(span, type(error).__qualname__)
        elif isinstance(result, ToolMessage):
            if result.status == "error":
                _failed(span, "tool_error")
            elif self.capture:
                span.set_attribute(TOOL_RESULT, content_text(result.content))
        span.end()

    def close(self, error: BaseException | None) -> None:
        self.end_tool(None, error)
        span, self.step = self.step, None
        if span is None:
            return
        if self.step_token is not None:
            otel_context.detach(self.step_token)
            self.step_token = None
        if error is not None:
            _failed(span, type(error).__qualname__)
        span.end()


@contextmanager
def step_runs() -> Iterator[None]:
    """Hold the spans of one model loop: ``step_run`` opens one per step visited, ``tool_calls`` one per call."""
    runs = _Runs()
    token = _traced_now.set(_Traced(_traced_now.get().turn, runs))
    try:
        yield
    except BaseException as exc:
        runs.close(exc)
        raise
    else:
        runs.close(None)
    finally:
        _traced_now.reset(token)


def step_run(step: StepLike) -> None:
    """The model loop is running ``step``: a new ``invoke_agent`` span unless it is already running it."""
    runs = _traced_now.get().runs
    if runs is not None and runs.step_id != step.id:
        runs.enter(step)


class _ToolCalls:
    """The calls of one model answer; each is traced from when it is taken until the next one is."""

    def __init__(self, runs: _Runs, running: _Turn, calls: Sequence[Mapping[str, Any]],
                 results: list[BaseMessage]) -> None:
        self.runs, self.running, self.calls, self.results = runs, running, calls, results
        self.index = 0

    def __iter__(self) -> _ToolCalls:
        return self

    def __next__(self) -> Any:
        if self.index:
            # The previous call ended with the tool message it added; an exception ends it in ``step_runs``.
            wanted = self.calls[self.index - 1].get("id")
            self.runs.end_tool(next((m for m in reversed(self.results)
                                     if isinstance(m, ToolMessage) and m.tool_call_id == wanted), None))
        if self.index == len(self.calls):
            raise StopIteration
        call = self.calls[self.index]
        self.index += 1
        self.runs.start_tool(self.running, call)
        return call


def tool_calls(calls: Sequence[Mapping[str, Any]], results: list[BaseMessage]) -> Iterator[Any]:
    """Iterate ``calls`` with an ``execute_tool`` span around each; its status comes from the call's message
    in ``results`` (a tool message with status ``error`` marks the span failed)."""
    runs, running = _traced_now.get().runs, _traced()
    if runs is None or runs.step is None or running is None:
        return iter(calls)
    return _ToolCalls(runs, running, calls, results)


# -- model calls ----------------------------------------------------------------------------------


class ModelCallSpan:
    """The span of one model call; ``answered`` and ``used`` record what the answer reports."""

    def __init__(self, span: Span, requested: str | None = None, capture: bool = False) -> None:
        self.span, self.requested, self.capture = span, requested, capture

    def answered(self, output: Any) -> Any:
        """Record the usage, finish reason and model an answer (an ``AIMessage`` or a structured output's
        ``{"raw": AIMessage, ...}``) reports; return ``output``."""
        span = self.span
        if not span.is_recording():
            return output
        message = output.get("raw") if isinstance(output, Mapping) else output
        if not isinstance(message, AIMessage):
            return output
        attributes = _usage_attributes(usage_from_message(message))
        metadata = message.response_metadata or {}
        reason = finish_reason(metadata)
        reasons = [reason] if reason else []
        if reasons:
            attributes[FINISH_REASONS] = reasons[:1]
        model = metadata.get("model_name") or metadata.get("model") or metadata.get("model_id")
        if isinstance(model, str) and model:
            attributes[RESPONSE_MODEL] = model
        response_id = metadata.get("id") or message.id
        if isinstance(response_id, str) and response_id and not response_id.startswith(_LANGCHAIN_IDS):
            attributes[RESPONSE_ID] = response_id
        if self.capture:
            reply = {**_as_message(message), **({"finish_reason": reasons[0]} if reasons else {})}
            attributes[OUTPUT_MESSAGES] = _json([reply])
        span.set_attributes(attributes)
        return output

    def used(self, usage: TokenUsage | None) -> None:
        """Record token usage reported apart from a message (a decision provider's)."""
        if usage is not None and self.span.is_recording():
            self.span.set_attributes(_usage_attributes(usage))


@contextmanager
def model_call(
    selection: ModelSelection | None, purpose: str, step_id: str | None,
    request: Sequence[BaseMessage] | None = None,
) -> Iterator[ModelCallSpan]:
    """The ``chat {model}`` span of one model call made for ``purpose`` (``chat``, ``decision`` or ``summary``)."""
    running = _traced()
    if running is None:
        yield _UNTRACED
        return
    attributes = running.attributes({OPERATION: "chat", PURPOSE: purpose})
    if step_id:
        attributes[STEP] = step_id
    if selection is not None:
        attributes[PROVIDER] = provider_name(selection.provider)
        attributes[REQUEST_MODEL] = selection.name
        address = server_address(selection.provider)
        if address:
            attributes[SERVER_ADDRESS] = address
        for key, attribute in _REQUEST_PARAMS.items():
            value = selection.params.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[attribute] = value
    if request and running.capture:
        attributes[INPUT_MESSAGES] = _json([_as_message(message) for message in request])
    name = f"chat {selection.name}" if selection is not None else "chat"
    span = _tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
    with _current(span):
        yield ModelCallSpan(span, selection.name if selection is not None else None, running.capture)


_UNTRACED = ModelCallSpan(trace.INVALID_SPAN)


def decision_route(step: str | None) -> None:
    """Mark the running step's span with the step its decision routes to."""
    span = trace.get_current_span()
    if step and span.is_recording():
        span.set_attribute(DECISION_ROUTE, step)


# -- helpers --------------------------------------------------------------------------------------


@contextmanager
def _current(span: Span) -> Iterator[None]:
    """``span`` current inside the block and ended after it; an exception marks it failed, by type only."""
    if not span.is_recording():
        try:
            yield
        finally:
            span.end()
        return
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        # The type only: an exception's text may quote the user.
        _failed(span, type(exc).__qualname__)
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _failed(span: Span, error_type: str) -> None:
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR))


def _usage_attributes(usage: TokenUsage) -> dict[str, Any]:
    attributes: dict[str, Any] = {INPUT_TOKENS: usage.input_tokens, OUTPUT_TOKENS: usage.output_tokens}
    # The breakdowns only when reported: most calls read or write no cache and do no reasoning.
    for attribute, count in ((CACHE_READ_TOKENS, usage.cached_input_tokens),
                             (CACHE_WRITE_TOKENS, usage.cache_creation_input_tokens),
                             (REASONING_TOKENS, usage.reasoning_tokens)):
        if count:
            attributes[attribute] = count
    return attributes


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _as_message(message: BaseMessage) -> dict[str, Any]:
    """A message in the conventions' ``{role, parts}`` shape."""
    text = content_text(message.content)
    parts: list[dict[str, Any]]
    if isinstance(message, ToolMessage):
        parts = [{"type": "tool_call_response", "id": message.tool_call_id, "result": text}]
    else:
        parts = [_text_part(text)] if text else []
    if isinstance(message, AIMessage):
        parts += [{"type": "tool_call", "id": call.get("id"), "name": call["name"], "arguments": call.get("args")}
                  for call in message.tool_calls]
    return {"role": _ROLES.get(message.type, message.type), "parts": parts}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
