"""The recovery hooks of a failed or refused model call: asked on the step first, then on the flow."""

from __future__ import annotations

from typing import Any

from picoflow.errors import LlmBlockedError, PicoFlowError
from picoflow.recovery import (
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmErrorContext,
    RetryWithModel,
    is_transient_error,
)
from picoflow.step import Step


def should_retry(step: Step, context: LlmAttemptErrorContext) -> bool:
    """The step's decision, else the flow's, else ``is_transient_error``."""
    for owner in (step, step.flow):
        decision = owner.should_retry_llm_error(context)
        if decision is not None:
            return bool(decision)
    return is_transient_error(context.error)


async def recover_from_error(step: Step, context: LlmErrorContext) -> Any:
    """The first non-None answer of ``on_llm_error`` on the step, then on the flow."""
    answer = await step.on_llm_error(context)
    if answer is None:
        answer = await step.flow.on_llm_error(context)
    return _unless_cancelled(context, answer)


async def handle_block(step: Step, context: LlmBlockedContext) -> Any:
    """The first non-None answer of ``on_llm_blocked`` on the step, then on the flow; else raise."""
    answer = await step.on_llm_blocked(context)
    if answer is None:
        answer = await step.flow.on_llm_blocked(context)
    if answer is None:
        raise LlmBlockedError(context)
    if isinstance(answer, RetryWithModel):
        raise PicoFlowError("on_llm_blocked() cannot switch models; return a safe reply or a route instead.")
    return _unless_cancelled(context, answer)


def _unless_cancelled(context: LlmErrorContext | LlmBlockedContext, answer: Any) -> Any:
    # A cancelled parallel worker stops here, whatever its hooks answered meanwhile.
    if context.signal is not None:
        context.signal.raise_if_cancelled()
    return answer
