"""The turn's deadline: set by the engine around each turn, checked before every model or decision call."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

from picoflow.errors import TurnDeadlineError

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
