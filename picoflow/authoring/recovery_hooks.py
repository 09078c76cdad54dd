"""The recovery hooks a step and its flow both declare, and the one rule that consults them: the step first, then
the flow, the first answer that is not None winning."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

from picoflow.authoring.recovery import (
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmErrorContext,
    RetryWithModel,
    is_transient_error,
)
from picoflow.errors import LlmBlockedError, PicoFlowError


class RecoveryHooks:
    """What a model call that failed or was refused asks its step, then its flow; None passes the question on."""

    def should_retry_llm_error(self, context: LlmAttemptErrorContext) -> bool | None:
        """After a model invocation raised: True retries, False stops, None passes on (the flow's answer, then
        ``is_transient_error``, decides)."""
        return None

    async def on_llm_error(self, context: LlmErrorContext) -> Any:
        """Once a model call failed for good: a reply, a route, ``retry_with_model(...)``, or None to pass on
        (after the flow, the failure propagates)."""
        return None

    async def on_llm_blocked(self, context: LlmBlockedContext) -> Any:
        """When the provider refused or filtered the call: a safe reply or a route, or None to pass on (after the
        flow, the refusal propagates)."""
        return None


async def first_answer(answers: Iterable[Any]) -> Any:
    """The first answer in ``answers`` that is not None, awaiting those that are awaitable.

    ``answers`` is a generator over the owners (the step, then the flow), so an owner after the one that answered
    is never asked.
    """
    for answer in answers:
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is not None:
            return answer
    return None


async def should_retry(owners: Sequence[RecoveryHooks], context: LlmAttemptErrorContext) -> bool:
    """The owners' decision in order, else ``is_transient_error``."""
    decision = await first_answer(owner.should_retry_llm_error(context) for owner in owners)
    return is_transient_error(context.error) if decision is None else bool(decision)


async def recover_from_error(owners: Sequence[RecoveryHooks], context: LlmErrorContext) -> Any:
    """The first answer of ``on_llm_error`` among the owners, or None."""
    answer = await first_answer(owner.on_llm_error(context) for owner in owners)
    return _unless_cancelled(context, answer)


async def handle_block(owners: Sequence[RecoveryHooks], context: LlmBlockedContext) -> Any:
    """The first answer of ``on_llm_blocked`` among the owners; without one, the refusal is raised."""
    answer = await first_answer(owner.on_llm_blocked(context) for owner in owners)
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
