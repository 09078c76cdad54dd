"""What the work running in an asyncio task answers to: the turn's deadline and, inside a model call, that
call's purpose, step and deadline (``CallScope``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

from picoflow.errors import TurnDeadlineError

T = TypeVar("T")

# Do not start a model or decision call with less time than this left before the turn deadline.
MIN_CALL_SECONDS = 1.0
# Time allowed past the turn deadline (inside an adapter's margin) to learn whether an unanswered save landed.
READ_BACK_SECONDS = 1.0

#: Why a model is called: a step's reply (``chat``), a DecisionStep's questions (``decision``), a memory
#: compaction's rolling summary (``summary``) or ``picoflow eval`` scoring a reply against a scenario (``judge``).
CallPurpose = Literal["chat", "decision", "summary", "judge"]


@dataclass(frozen=True)
class CallScope:
    """The turn's deadline and, while a model call runs, what it is for and when it must answer."""

    #: The ``time.monotonic()`` time by which the turn must answer; None: no limit.
    turn_deadline: float | None = None
    #: The purpose of the model call running (a step's own calls are chat calls).
    purpose: CallPurpose = "chat"
    #: The id of the step whose model call is running; None outside step calls (e.g. summaries).
    step: str | None = None
    #: The ``time.monotonic()`` time by which the running model call must answer; None: the client's own limit.
    call_deadline: float | None = None


# Outside any turn: no deadline, and no model call running.
_OUTSIDE_CALLS = CallScope()
# A ContextVar because the readers sit behind code that cannot pass it on: store calls, LangChain's model
# invocation (an HTTP client hook, a scripted model) and the worker tasks of a parallel batch.
_scope: contextvars.ContextVar[CallScope] = contextvars.ContextVar(
    "picoflow_call_scope", default=_OUTSIDE_CALLS
)


def current_scope() -> CallScope:
    """The scope of the work running in this task."""
    return _scope.get()


@contextlib.contextmanager
def scoped(scope: CallScope) -> Iterator[CallScope]:
    """Run the block under ``scope``."""
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_deadline() -> float | None:
    """The ``time.monotonic()`` deadline of the turn running in this task, if any."""
    return _scope.get().turn_deadline


def turn_deadline(deadline: float | None) -> contextlib.AbstractContextManager[CallScope]:
    """Run the block under ``deadline`` (a ``time.monotonic()`` value, or None for no limit)."""
    return scoped(CallScope(turn_deadline=deadline))


def time_left(before: str) -> float | None:
    """Seconds left for the call named by ``before``; None without a deadline.

    Raises ``TurnDeadlineError`` when too little time is left to start it.
    """
    deadline = _scope.get().turn_deadline
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining < MIN_CALL_SECONDS:
        raise TurnDeadlineError(f"The turn ran out of time before {before}; please retry.")
    return remaining


async def within_turn(call: Awaitable[T], *, reserve: float = 0.0) -> T:
    """Await ``call``, giving up ``reserve`` seconds before the deadline (``TimeoutError``)."""
    deadline = _scope.get().turn_deadline
    return await asyncio.wait_for(call, None if deadline is None else max(deadline - reserve - time.monotonic(), 0.01))


async def bounded_turn(call: Awaitable[T]) -> T:
    """Run the turn's steps, cut off at the deadline (flow code that never returns must not outlast it)."""
    try:
        return await within_turn(call)
    except TimeoutError as exc:
        deadline = _scope.get().turn_deadline
        if deadline is not None and time.monotonic() >= deadline:
            raise TurnDeadlineError("The turn's steps did not finish before the deadline.") from exc
        raise


async def before_deadline(call: Awaitable[T]) -> T:
    """Await a store call, giving up when the turn's deadline passes (a hung backend must not outlast it)."""
    try:
        return await within_turn(call)
    except TimeoutError as exc:
        raise TurnDeadlineError("The session store did not answer before the turn deadline; please retry.") from exc


def read_back_budget() -> float:
    """Seconds left to read back an unsettled save: up to ``READ_BACK_SECONDS`` past the deadline."""
    deadline = _scope.get().turn_deadline
    return READ_BACK_SECONDS if deadline is None else deadline + READ_BACK_SECONDS - time.monotonic()

