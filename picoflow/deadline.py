"""The turn's deadline: how much time the running turn has left, carried per asyncio task."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from picoflow.errors import TurnDeadlineError

T = TypeVar("T")

# Do not start a model or decision call with less time than this left before the turn deadline.
MIN_CALL_SECONDS = 1.0
# Time allowed past the turn deadline (inside an adapter's margin) to learn whether an unanswered save landed.
READ_BACK_SECONDS = 1.0

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("picoflow_turn_deadline", default=None)


def current_deadline() -> float | None:
    """The ``time.monotonic()`` deadline of the turn running in this task, if any."""
    return _deadline.get()


@contextlib.contextmanager
def turn_deadline(deadline: float | None) -> Iterator[None]:
    """Run the block under ``deadline`` (a ``time.monotonic()`` value, or None for no limit)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left(before: str) -> float | None:
    """Seconds left for the call named by ``before``; None without a deadline.

    Raises ``TurnDeadlineError`` when too little time is left to start it.
    """
    deadline = _deadline.get()
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining < MIN_CALL_SECONDS:
        raise TurnDeadlineError(f"The turn ran out of time before {before}; please retry.")
    return remaining


async def within_turn(call: Awaitable[T], *, reserve: float = 0.0) -> T:
    """Await ``call``, giving up ``reserve`` seconds before the deadline (``TimeoutError``)."""
    deadline = _deadline.get()
    return await asyncio.wait_for(call, None if deadline is None else max(deadline - reserve - time.monotonic(), 0.01))


async def bounded_turn(call: Awaitable[T]) -> T:
    """Run the turn's steps, cut off at the deadline (flow code that never returns must not outlast it)."""
    try:
        return await within_turn(call)
    except TimeoutError as exc:
        deadline = _deadline.get()
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
    deadline = _deadline.get()
    return READ_BACK_SECONDS if deadline is None else deadline + READ_BACK_SECONDS - time.monotonic()

