"""One model call of a step: its attempts (each bounded in time and abandoned on cancellation), the provider's
refusals, and the recovery hooks that answer when the attempts run out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.runnables import Runnable

from picoflow import telemetry
from picoflow.authoring.recovery import (
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmCallPolicy,
    LlmErrorContext,
    LlmErrorKind,
    RetryWithModel,
    StopReason,
)
from picoflow.authoring.recovery_hooks import handle_block, recover_from_error, should_retry
from picoflow.authoring.step import Step
from picoflow.authoring.step_tools import offered_names
from picoflow.conversation.memory import Namespace
from picoflow.deadline import time_left
from picoflow.errors import (
    ModelNotConfiguredError,
    ModelUnavailableError,
    ParallelCancelledError,
    PicoFlowError,
)
from picoflow.files.reader import with_file_parts
from picoflow.files.reopen import OPEN_FILE_TOOL, open_file_tool
from picoflow.mcp import MCPTools, ToolOffer, offered_tools
from picoflow.messages import (
    EMPTY_RESPONSE_NUDGE,
    HumanMessageEx,
    TurnNotesMessage,
    add_usage,
    as_text,
    content_text,
    summary_system_message,
)
from picoflow.models.calls import model_call_for
from picoflow.models.refusals import configuration_error
from picoflow.models.registry import ModelSelection
from picoflow.models.vocabulary import Block, Vocabulary
from picoflow.turn import streaming
from picoflow.turn.hop import Hop
from picoflow.wire import PLAIN_TEXT


@dataclass
class ModelCall:
    """What one model call of a hop reads from its step once, for its attempts and its tool dispatch alike: the
    hop, the tools it offers, the model it calls and how (the call policy, the output schema)."""

    hop: Hop
    #: The flow-registry tools offered, in order.
    tools: list[str]
    #: What ``use_mcp_tools()`` returned; the servers are listed when first needed.
    mcp_offers: list[MCPTools]
    #: The step's own model (a fallback that ``on_llm_error`` chose replaces it for later calls).
    selection: ModelSelection
    policy: LlmCallPolicy
    #: What ``struct_output_schema()`` returned: the answer's schema, or None for free text.
    schema: Any
    _mcp: ToolOffer | None = None

    @classmethod
    def read(cls, hop: Hop) -> ModelCall:
        step = hop.step
        mcp_offers = step.use_mcp_tools()
        return cls(hop, offered_names(type(step), step.use_tools(), mcp_offers), mcp_offers, step.model_selection(),
                   step.get_llm_call_policy(), step.struct_output_schema())

    async def mcp_tools(self, step: Step) -> ToolOffer:
        """The MCP server tools offered, by name; a step offering none never reaches the MCP client."""
        if self._mcp is None:
            if self.mcp_offers:
                sessions = step.flow.run_context.require_services().mcp
                self._mcp = await offered_tools(sessions, step.flow, self.mcp_offers)
            else:
                self._mcp = ToolOffer()
        return self._mcp


@dataclass(frozen=True)
class ModelOutcome:
    """An accepted model answer, or (``ai`` None) the answer a recovery hook gave instead."""

    ai: AIMessage | None = None
    parsed: Any = None
    answer: Any = None
    # The fallback model ``on_llm_error`` chose; it serves the step's later calls in this loop.
    fallback: ModelSelection | None = None


@dataclass(frozen=True)
class Failure:
    """Why the last attempt of a call failed, and how many were made."""

    kind: LlmErrorKind
    reason: str
    message: str
    attempts: int
    error: BaseException | None = None
    last_response: Any = None
    stopped_because: StopReason = "attempts_exhausted"

    def as_error(
        self, selection: ModelSelection, vocabulary: Vocabulary
    ) -> ModelUnavailableError | ModelNotConfiguredError:
        """The error the turn fails with, the provider's error read in its ``vocabulary``."""
        # Codes of their own, so clients and metrics tell a failing model apart from a failing flow; none aborts.
        text = f"LLM call failed. Reason:{self.reason}. Error:{self.message}"
        configuration = configuration_error(self.error, selection.provider, text, vocabulary)
        if configuration is not None:
            return configuration
        if self.reason == "timeout":
            return ModelUnavailableError(text, code="MODEL_TIMEOUT", status_code=504)
        if vocabulary.is_throttling(self.error):
            return ModelUnavailableError(text, code="MODEL_THROTTLED", status_code=503)
        return ModelUnavailableError(text)


def build_request(step: Step, space: Namespace) -> list[BaseMessage]:
    """Rewrite the system slot of ``step``'s namespace ``space`` from ``get_prompt()`` and assemble what the model
    is sent."""
    history = space.messages
    prompt = step.get_prompt() or ""
    history[0] = SystemMessage(content=prompt)
    request: list[BaseMessage] = [history[0]] if prompt else []
    if space.summary:
        request.append(summary_system_message(space.summary))
    request.extend(history[1:])
    notes = step.get_turn_notes()
    if notes:
        request.append(TurnNotesMessage(notes))
    return request


async def call_model(offer: ModelCall, fallback: ModelSelection | None = None) -> ModelOutcome:
    """One accepted model result for ``step``, or the answer of its recovery hooks.

    Ordinary attempts use the step's selection and its attempt budget; a ``fallback`` (chosen earlier
    by ``on_llm_error``) gets one attempt per call and cannot be replaced by a second fallback.
    """
    bound = await _bind(offer, fallback or offer.selection)
    outcome = await _attempts(offer, bound, 1 if fallback else bound.selection.retry_attempts)
    if isinstance(outcome, ModelOutcome):
        return outcome
    answer = await _recover(offer.hop, bound, outcome)
    if isinstance(answer, RetryWithModel) and fallback is None:
        alternate = await _bind(offer, answer.selection)
        outcome = await _attempts(offer, alternate, 1)
        if isinstance(outcome, ModelOutcome):
            return dataclasses.replace(outcome, fallback=alternate.selection)
        answer = await _recover(offer.hop, alternate, outcome)
    if isinstance(answer, RetryWithModel):
        raise PicoFlowError(f"Step '{offer.hop.step.id}' asked for a second fallback model in one recovery sequence.")
    return ModelOutcome(answer=answer)


async def _recover(hop: Hop, bound: _Bound, failure: Failure) -> Any:
    step, selection = hop.step, bound.selection
    context = LlmErrorContext.at(
        step.id, selection, kind=failure.kind, attempts=failure.attempts, stopped_because=failure.stopped_because,
        error=failure.error, last_response=failure.last_response, signal=hop.signal,
    )
    answer = await recover_from_error((step, hop.flow), context)
    if answer is None:
        raise failure.as_error(selection, bound.vocabulary) from failure.error
    return answer


async def _blocked(hop: Hop, selection: ModelSelection, block: Block) -> ModelOutcome:
    step = hop.step
    hop.flow.logger.warn("model call blocked by the provider", step=step.id, reason=block.reason, phase=block.phase)
    context = LlmBlockedContext.at(
        step.id, selection, reason=block.reason, raw_reason=block.raw_reason, phase=block.phase, details=block.details,
        signal=hop.signal,
    )
    return ModelOutcome(answer=await handle_block((step, hop.flow), context))


# -- the attempts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Bound:
    """What every attempt of one call shares: the model bound to its tools or output schema, and its limits."""

    selection: ModelSelection
    model: BaseChatModel
    runnable: Runnable[Any, Any]
    tools: list[dict[str, Any]]
    schema: Any
    #: Whether the built-in open_file may be offered (no structured output, and no tool of that name).
    can_open: bool
    policy_ms: int | None
    stall: float | None
    vocabulary: Vocabulary
    #: The file types the provider reads, for a request that references files.
    file_types: frozenset[str]


async def _bind(offer: ModelCall, selection: ModelSelection) -> _Bound:
    flow = offer.hop.flow
    providers = flow.run_context.require_services().providers
    model = providers.chat_model(selection)
    specs = [flow.run_context.require_tool(name, flow.id) for name in offer.tools]
    schema, policy = offer.schema, offer.policy
    # Tools offered from MCP servers come with their servers' schemas (listed when first needed).
    offered = ([] if schema is not None
               else [t.as_model_tool() for t in (await offer.mcp_tools(offer.hop.step)).tools.values()])
    tools = [spec.as_model_tool() for spec in specs] + offered
    runnable: Runnable[Any, Any]
    if schema is not None:
        runnable = model.with_structured_output(schema, include_raw=True)
    elif tools:
        runnable = model.bind_tools(tools)
    else:
        runnable = model
    # The built-in open_file is offered when a request references a file shown earlier, unless a tool has its name.
    can_open = schema is None and OPEN_FILE_TOOL not in {tool["function"]["name"] for tool in tools}
    return _Bound(selection, model, runnable, tools, schema, can_open, policy.timeout_ms,
                  policy.stall_ms / 1000 if policy.stall_ms else None, providers.vocabulary(selection),
                  providers.file_types(selection))


async def _attempts(offer: ModelCall, bound: _Bound, budget: int) -> ModelOutcome | Failure:
    """Up to ``budget`` attempts of the ``bound`` model: the first accepted result, a refusal's answer, or the last
    failure."""
    hop = offer.hop
    step, signal, selection = hop.step, hop.signal, bound.selection
    runtime = hop.flow.run_context.require_services()
    failure = Failure("invocation_error", "unknown", "no attempt was made", attempts=0)
    for attempt in range(1, budget + 1):
        if attempt > 1 and runtime.retry_delay:
            await asyncio.sleep(runtime.retry_delay)
        if signal is not None:
            signal.raise_if_cancelled()
        result = await _attempt(offer, bound, attempt)
        if isinstance(result, Block):
            # A refusal is final for this call: no ordinary retry and no on_llm_error.
            return await _blocked(hop, selection, result)
        if isinstance(result, ModelOutcome):
            return result
        failure = result
        # Only an invocation that raised asks whether to retry: the other failures go on to the next attempt.
        if attempt < budget and failure.error is not None and not await should_retry((step, hop.flow), (
            LlmAttemptErrorContext.at(step.id, selection, error=failure.error, attempt=attempt, max_attempts=budget,
                                      signal=signal)
        )):
            return dataclasses.replace(failure, stopped_because="retry_declined")
    return failure


async def _attempt(offer: ModelCall, bound: _Bound, attempt: int) -> ModelOutcome | Failure | Block:
    """One invocation of the model and the judgement of what it returned."""
    hop = offer.hop
    flow, step = hop.flow, hop.step
    request = build_request(step, hop.space)
    called = bound.runnable
    # Outside the attempt's error handling: a file the model cannot read is the caller's error, not a retry.
    if any(isinstance(message.content, list) for message in request):
        # Only multimodal content can reference files: plain text needs no look at the file store.
        prepared = await with_file_parts(request, flow.run_context.files, bound.file_types, step.id, step.namespace,
                                         can_open=bound.can_open)
        request = prepared.messages
        if prepared.openable:
            called = bound.model.bind_tools([*bound.tools, open_file_tool()])
    timeout = _attempt_timeout(bound.policy_ms)
    # Structured output arrives whole; a plain reply of the turn's own top-level step streams to the client.
    sink = hop.sink if bound.schema is None and step.content_type == PLAIN_TEXT else None
    try:
        with telemetry.model_call(bound.selection, "chat", step.id, request) as traced:
            call = (called.ainvoke(request) if sink is None
                    else streaming.streamed_call(called, request, sink, bound.stall))
            output = traced.answered(await _invoke(call, timeout, hop.signal, step.id))
    except TimeoutError as exc:
        # Without a turn deadline or call policy the timeout is the provider's own.
        limit = "its time limit" if timeout is None else f"{timeout * 1000:.0f} ms"
        problem = str(exc) if isinstance(exc, streaming.StalledReplyError) else f"the model call exceeded {limit}"
        flow.logger.warn("model attempt timed out", step=step.id, attempt=attempt)
        return Failure("invocation_error", "timeout", problem, attempt, exc)
    except ParallelCancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any provider error counts as a failed attempt
        block = bound.vocabulary.blocked_error(exc)
        if block is not None:
            return block
        flow.logger.warn("model attempt failed", step=step.id, attempt=attempt, error=type(exc).__name__)
        return Failure("invocation_error", "error", f"{type(exc).__name__}: {exc}", attempt, exc)
    return _judge(hop, bound, output, attempt)


def _judge(hop: Hop, bound: _Bound, output: Any, attempt: int) -> ModelOutcome | Failure | Block:
    """What an invocation returned, accepted, refused by the provider or failed (unparsable, empty, rejected)."""
    flow, step = hop.flow, hop.step
    ai = output.get("raw") if bound.schema is not None else output
    if isinstance(ai, AIMessage):
        # Token accounting records attempted work, workers' included.
        add_usage(flow.run_context.require_doc().tokens, ai)
    block = bound.vocabulary.blocked_response(ai)
    if block is not None:
        return block
    parsed = None
    if bound.schema is not None:
        parsed = output.get("parsed")
        if parsed is None:
            problem = str(output.get("parsing_error") or "no structured output")
            flow.logger.warn("model attempt returned unusable structured output", step=step.id, attempt=attempt)
            return Failure("empty_response", "parse", problem, attempt, last_response=ai)
        if not isinstance(ai, AIMessage):
            ai = AIMessage(content=as_text(parsed))
    elif not ai.tool_calls and not content_text(ai.content).strip():
        reason = str(ai.response_metadata.get("finish_reason") or "empty")
        hop.space.messages.append(HumanMessageEx(step.id, EMPTY_RESPONSE_NUDGE, origin="framework"))
        return Failure("empty_response", reason, "the model returned an empty response", attempt, last_response=ai)
    result = parsed if parsed is not None else ai
    if step.check_response(result):
        return Failure("response_rejected", "rejected", "check_response() rejected the result", attempt,
                       last_response=result)
    return ModelOutcome(ai=ai, parsed=parsed)


async def _invoke(call: Coroutine[Any, Any, Any], timeout: float | None, signal: Any, step_id: str) -> Any:
    """One model invocation (a whole stream, when streamed), bounded by ``timeout`` and abandoned as soon as
    ``signal`` is cancelled."""
    with model_call_for("chat", step_id, timeout):
        return await _invoke_bounded(call, timeout, signal)


async def _invoke_bounded(invocation: Coroutine[Any, Any, Any], timeout: float | None, signal: Any) -> Any:
    if signal is None:
        return await asyncio.wait_for(invocation, timeout)
    call = asyncio.ensure_future(invocation)
    stop = asyncio.ensure_future(signal.wait())
    try:
        done, _ = await asyncio.wait({call, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
    if call in done:
        return call.result()
    signal.raise_if_cancelled()
    raise TimeoutError


def _attempt_timeout(policy_ms: int | None) -> float | None:
    """Seconds for one attempt: the step's call policy (``policy_ms``), bounded by what is left of the turn."""
    remaining = time_left("the next model call")
    limits = [limit for limit in (remaining, policy_ms / 1000 if policy_ms else None) if limit is not None]
    return min(limits) if limits else None
