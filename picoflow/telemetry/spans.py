"""The spans of a turn: ``invoke_workflow`` for the turn, ``invoke_agent`` for each step run, ``chat`` for each model
call and ``execute_tool`` for each tool call, opened through the public OpenTelemetry API only."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from picoflow.messages import content_text, finish_reason, usage_from_message
from picoflow.models.registry import ModelSelection
from picoflow.results import RunResponse
from picoflow.session.document import TokenUsage
from picoflow.telemetry.conventions import (
    AGENT_NAME,
    COMPLETED,
    CONVERSATION,
    DECISION_ROUTE,
    ERROR_TYPE,
    FINISH_REASONS,
    INPUT_MESSAGES,
    LANGCHAIN_IDS,
    OPERATION,
    OUTPUT_MESSAGES,
    PROVIDER,
    PURPOSE,
    REQUEST_MODEL,
    REQUEST_PARAMS,
    RESPONSE_ID,
    RESPONSE_MODEL,
    SERVER_ADDRESS,
    STEP,
    TOOL_ARGUMENTS,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_RESULT,
    TOOL_TYPE,
    WORKFLOW_NAME,
    as_message,
    capture_content,
    provider_name,
    server_address,
    session_digest,
    text_part,
    to_json,
    usage_attributes,
)

_tracer = trace.get_tracer("picoflow")


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Send PicoFlow's spans to ``provider`` instead of the process's global one (None: back to the global)."""
    global _tracer
    _tracer = provider.get_tracer("picoflow") if provider is not None else trace.get_tracer("picoflow")


def trace_only_context() -> contextvars.Context:
    """A fresh context holding nothing but the current trace context, for a task that outlives its starter.

    Such a task (an MCP session held open across turns) must not inherit the starter's other context variables,
    a turn's deadline among them; its spans still join the starter's trace, under the span current at the start,
    rather than each becoming the root of a trace of its own.
    """
    fresh = contextvars.Context()
    fresh.run(otel_context.attach, otel_context.get_current())
    return fresh


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
                reply = {"role": "assistant", "parts": [text_part(response.message)], "finish_reason": "stop"}
                attributes[OUTPUT_MESSAGES] = to_json([reply])
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
        span.set_attribute(INPUT_MESSAGES, to_json([{"role": "user", "parts": [text_part(user_message)]}]))
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
            attributes[TOOL_ARGUMENTS] = to_json(call.get("args") or {})
        span = _tracer.start_span(f"execute_tool {call['name']}", attributes=attributes)
        self.tool, self.tool_token = span, otel_context.attach(trace.set_span_in_context(span))
        self.capture = running.capture

    def end_tool(self, result: BaseMessage | None, error: BaseException | None = None) -> None:
        span, token = self.tool, self.tool_token
        self.tool = self.tool_token = None
        if span is None:
            return
        _leave(span, token, error)
        if error is None and isinstance(result, ToolMessage):
            if result.status == "error":
                _failed(span, "tool_error")
            elif self.capture:
                span.set_attribute(TOOL_RESULT, content_text(result.content))
        span.end()

    def close(self, error: BaseException | None) -> None:
        self.end_tool(None, error)
        span, token = self.step, self.step_token
        self.step = self.step_token = None
        if span is None:
            return
        _leave(span, token, error)
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
        attributes = usage_attributes(usage_from_message(message))
        metadata = message.response_metadata or {}
        reason = finish_reason(metadata)
        reasons = [reason] if reason else []
        if reasons:
            attributes[FINISH_REASONS] = reasons[:1]
        model = metadata.get("model_name") or metadata.get("model") or metadata.get("model_id")
        if isinstance(model, str) and model:
            attributes[RESPONSE_MODEL] = model
        response_id = metadata.get("id") or message.id
        if isinstance(response_id, str) and response_id and not response_id.startswith(LANGCHAIN_IDS):
            attributes[RESPONSE_ID] = response_id
        if self.capture:
            reply = {**as_message(message), **({"finish_reason": reasons[0]} if reasons else {})}
            attributes[OUTPUT_MESSAGES] = to_json([reply])
        span.set_attributes(attributes)
        return output

    def used(self, usage: TokenUsage | None) -> None:
        """Record token usage reported apart from a message (a decision provider's)."""
        if usage is not None and self.span.is_recording():
            self.span.set_attributes(usage_attributes(usage))


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
        for key, attribute in REQUEST_PARAMS.items():
            value = selection.params.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[attribute] = value
    if request and running.capture:
        attributes[INPUT_MESSAGES] = to_json([as_message(message) for message in request])
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


def _leave(span: Span, token: Token[Context] | None, error: BaseException | None) -> None:
    """Leave ``span``'s context (entered with ``token``), marking the span failed when ``error`` ended it."""
    if token is not None:
        otel_context.detach(token)
    if error is not None:
        _failed(span, type(error).__qualname__)


def _failed(span: Span, error_type: str) -> None:
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR))
