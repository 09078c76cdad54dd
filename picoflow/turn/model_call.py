"""One model call of a step: its attempts, per-attempt timeouts, refusals and recovery hooks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

from picoflow.compaction import summary_system_message
from picoflow.errors import ModelUnavailableError, ParallelCancelledError, PicoFlowError
from picoflow.execution import cancellation_signal
from picoflow.flow import Flow
from picoflow.mcp import offered_tools
from picoflow.messages import EMPTY_RESPONSE_NUDGE, HumanMessageEx, as_text, content_text
from picoflow.models.caching import TurnNotesMessage
from picoflow.models.context import call_deadline, model_call_for
from picoflow.models.selection import ModelSelection
from picoflow.recovery import (
    Block,
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmErrorContext,
    LlmErrorKind,
    RetryWithModel,
    StopReason,
    blocked_error,
    blocked_response,
)
from picoflow.step import Step
from picoflow.tokens import add_usage
from picoflow.turn.attachments import with_file_parts
from picoflow.turn.deadline import time_left
from picoflow.turn.recovery import handle_block, recover_from_error, should_retry


@dataclass
class ModelOutcome:
    """An accepted model answer, or (``ai`` None) the answer a recovery hook gave instead."""

    ai: AIMessage | None = None
    parsed: Any = None
    answer: Any = None
    # The fallback model ``on_llm_error`` chose; it serves the step's later calls in this loop.
    fallback: ModelSelection | None = None


@dataclass
class _Failure:
    kind: LlmErrorKind
    reason: str
    message: str
    attempts: int
    error: BaseException | None = None
    last_response: Any = None
    stopped_because: StopReason = "attempts_exhausted"

    def as_error(self) -> ModelUnavailableError:
        # Codes of their own, so clients and metrics tell a failing model apart from a failing flow; none aborts.
        text = f"LLM call failed. Reason:{self.reason}. Error:{self.message}"
        if self.reason == "timeout":
            return ModelUnavailableError(text, code="MODEL_TIMEOUT", status_code=504)
        if _is_throttling(self.error):
            return ModelUnavailableError(text, code="MODEL_THROTTLED", status_code=503)
        return ModelUnavailableError(text)


_THROTTLING_NAMES = frozenset({"RateLimitError", "ThrottlingException", "ResourceExhausted", "TooManyRequests"})


def _is_throttling(error: BaseException | None) -> bool:
    # OpenAI-style clients raise RateLimitError with status 429, Google's ResourceExhausted carries code 429,
    # and botocore's ClientError names ThrottlingException in its response.
    if error is None:
        return False
    if 429 in (getattr(error, "status_code", None), getattr(error, "code", None)):
        return True
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return type(error).__name__ in _THROTTLING_NAMES or code in _THROTTLING_NAMES


def build_request(step: Step) -> list[BaseMessage]:
    """Rewrite the system slot from ``get_prompt()`` and assemble what the model is sent."""
    history = step.get_memory()
    prompt = step.get_prompt() or ""
    history[0] = SystemMessage(content=prompt)
    request: list[BaseMessage] = [history[0]] if prompt else []
    summary = step.flow.get_memory().namespace(step.namespace).summary
    if summary:
        request.append(summary_system_message(summary))
    request.extend(history[1:])
    notes = step.get_turn_notes()
    if notes:
        request.append(TurnNotesMessage(notes))
    return request


async def call_model(flow: Flow, step: Step, fallback: ModelSelection | None = None) -> ModelOutcome:
    """One accepted model result for ``step``, or the answer of its recovery hooks.

    Ordinary attempts use the step's selection and its attempt budget; a ``fallback`` (chosen earlier
    by ``on_llm_error``) gets one attempt per call and cannot be replaced by a second fallback.
    """
    selection = fallback or step.model_selection()
    outcome = await _attempts(flow, step, selection, 1 if fallback else selection.retry_attempts)
    if isinstance(outcome, ModelOutcome):
        return outcome
    answer = await _recover(flow, step, selection, outcome)
    if isinstance(answer, RetryWithModel) and fallback is None:
        alternate = answer.selection
        outcome = await _attempts(flow, step, alternate, 1)
        if isinstance(outcome, ModelOutcome):
            outcome.fallback = alternate
            return outcome
        answer = await _recover(flow, step, alternate, outcome)
    if isinstance(answer, RetryWithModel):
        raise PicoFlowError(f"Step '{step.id}' asked for a second fallback model in one recovery sequence.")
    return ModelOutcome(answer=answer)


async def _recover(flow: Flow, step: Step, selection: ModelSelection, failure: _Failure) -> Any:
    context = LlmErrorContext(
        kind=failure.kind,
        step_id=step.id,
        provider=selection.provider,
        model=selection.name,
        attempts=failure.attempts,
        stopped_because=failure.stopped_because,
        error=failure.error,
        last_response=failure.last_response,
        signal=cancellation_signal(flow),
    )
    answer = await recover_from_error(step, context)
    if answer is None:
        raise failure.as_error() from failure.error
    return answer


async def _blocked(flow: Flow, step: Step, selection: ModelSelection, block: Block) -> ModelOutcome:
    flow.logger.warn("model call blocked by the provider", step=step.id, reason=block.reason, phase=block.phase)
    context = LlmBlockedContext(
        step_id=step.id,
        provider=selection.provider,
        model=selection.name,
        reason=block.reason,
        raw_reason=block.raw_reason,
        phase=block.phase,
        details=block.details,
        signal=cancellation_signal(flow),
    )
    return ModelOutcome(answer=await handle_block(step, context))


async def _attempts(flow: Flow, step: Step, selection: ModelSelection, budget: int) -> ModelOutcome | _Failure:
    runtime = flow._turn()
    model = runtime.providers.chat_model(selection)
    specs = [flow._require_tool(name) for name in step._exposed_tool_names()]
    schema = step.struct_output_schema()
    # Tools offered from MCP servers come with their servers' schemas (listed when first needed).
    offered = [] if schema is not None else [tool.as_model_tool() for tool in (await offered_tools(step)).values()]
    if schema is not None:
        runnable = model.with_structured_output(schema, include_raw=True)
    elif specs or offered:
        runnable = model.bind_tools([spec.as_model_tool() for spec in specs] + offered)
    else:
        runnable = model
    signal = cancellation_signal(flow)

    failure = _Failure("invocation_error", "unknown", "no attempt was made", attempts=0)
    for attempt in range(1, budget + 1):
        if attempt > 1 and runtime.retry_delay:
            await asyncio.sleep(runtime.retry_delay)
        if signal is not None:
            signal.raise_if_cancelled()
        request = build_request(step)
        # Outside the attempt's error handling: a file the model cannot read is the caller's error, not a retry.
        request = await with_file_parts(request, runtime.files, runtime.providers.file_types(selection), step.id)
        timeout = _attempt_timeout(step)
        try:
            output = await _invoke(runnable, request, timeout, signal, step.id)
        except TimeoutError as exc:
            limit = f"{timeout * 1000:.0f} ms"
            failure = _Failure("invocation_error", "timeout", f"the model call exceeded {limit}", attempt, exc)
            flow.logger.warn("model attempt timed out", step=step.id, attempt=attempt)
        except ParallelCancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any provider error counts as a failed attempt
            block = blocked_error(exc)
            if block is not None:
                return await _blocked(flow, step, selection, block)
            failure = _Failure("invocation_error", "error", f"{type(exc).__name__}: {exc}", attempt, exc)
            flow.logger.warn("model attempt failed", step=step.id, attempt=attempt, error=type(exc).__name__)
        else:
            ai = output.get("raw") if schema is not None else output
            if isinstance(ai, AIMessage):
                # Token accounting records attempted work, workers' included.
                add_usage(runtime.doc.tokens, ai)
            block = blocked_response(ai)
            if block is not None:
                # A refusal is final for this call: no ordinary retry and no on_llm_error.
                return await _blocked(flow, step, selection, block)
            parsed = None
            if schema is not None:
                parsed = output.get("parsed")
                if parsed is None:
                    problem = str(output.get("parsing_error") or "no structured output")
                    failure = _Failure("empty_response", "parse", problem, attempt, last_response=ai)
                    flow.logger.warn("model attempt returned unusable structured output", step=step.id, attempt=attempt)
                    continue
                if not isinstance(ai, AIMessage):
                    ai = AIMessage(content=as_text(parsed))
            elif not ai.tool_calls and not content_text(ai.content).strip():
                reason = str(ai.response_metadata.get("finish_reason") or "empty")
                failure = _Failure("empty_response", reason, "the model returned an empty response", attempt,
                                   last_response=ai)
                step.get_memory().append(HumanMessageEx(step, EMPTY_RESPONSE_NUDGE, origin="framework"))
                continue
            if step.check_response(parsed if parsed is not None else ai):
                failure = _Failure("response_rejected", "rejected", "check_response() rejected the result", attempt,
                                   last_response=parsed if parsed is not None else ai)
                continue
            return ModelOutcome(ai=ai, parsed=parsed)
        if attempt < budget:
            context = LlmAttemptErrorContext(
                step_id=step.id,
                provider=selection.provider,
                model=selection.name,
                error=failure.error,
                attempt=attempt,
                max_attempts=budget,
                signal=signal,
            )
            if not should_retry(step, context):
                failure.stopped_because = "retry_declined"
                break
    return failure


async def _invoke(runnable: Any, request: list[BaseMessage], timeout: float | None, signal: Any, step_id: str) -> Any:
    """One model invocation, bounded by ``timeout`` and abandoned as soon as ``signal`` is cancelled."""
    limit = call_deadline.set(None if timeout is None else time.monotonic() + timeout)
    try:
        with model_call_for("chat", step_id):
            return await _invoke_bounded(runnable, request, timeout, signal)
    finally:
        call_deadline.reset(limit)


async def _invoke_bounded(runnable: Any, request: list[BaseMessage], timeout: float | None, signal: Any) -> Any:
    if signal is None:
        return await asyncio.wait_for(runnable.ainvoke(request), timeout)
    call = asyncio.ensure_future(runnable.ainvoke(request))
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


def _attempt_timeout(step: Step) -> float | None:
    """Seconds for one attempt: the step's call policy, bounded by what is left of the turn."""
    remaining = time_left("the next model call")
    policy_ms = step.get_llm_call_policy().timeout_ms
    limits = [limit for limit in (remaining, policy_ms / 1000 if policy_ms else None) if limit is not None]
    return min(limits) if limits else None
