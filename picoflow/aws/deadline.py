"""How much of a Lambda invocation's time a turn may use.

The engine gets a deadline ``DEADLINE_MARGIN_SECONDS`` before Lambda ends the invocation; past it the
engine may still spend ``READ_BACK_SECONDS`` learning whether an unanswered save landed, so the margin
holds that read-back plus ``HARD_LIMIT_MARGIN_SECONDS`` and some slack. The handler stops waiting for the
engine ``HARD_LIMIT_MARGIN_SECONDS`` before the end, to answer while it still can.
"""

from __future__ import annotations

import time
from typing import Protocol

from picoflow.deadline import READ_BACK_SECONDS

HARD_LIMIT_MARGIN_SECONDS = 0.5
# Slack for answering and logging after the read-back.
DEADLINE_MARGIN_SECONDS = READ_BACK_SECONDS + HARD_LIMIT_MARGIN_SECONDS + 0.5
# The shortest wait the handler grants the engine, however late the request arrives.
MIN_WAIT_SECONDS = 0.1


class InvocationContext(Protocol):
    """The part of the Lambda context that tells the time left."""

    def get_remaining_time_in_millis(self) -> int: ...


def turn_deadline(context: InvocationContext | None) -> float | None:
    """The ``time.monotonic()`` deadline handed to the engine; None without a Lambda context."""
    if context is None:
        return None
    return time.monotonic() + context.get_remaining_time_in_millis() / 1000 - DEADLINE_MARGIN_SECONDS


def wait_limit(context: InvocationContext | None) -> float | None:
    """Seconds the handler waits for the engine before answering on its own; None: no limit."""
    if context is None:
        return None
    return max(context.get_remaining_time_in_millis() / 1000 - HARD_LIMIT_MARGIN_SECONDS, MIN_WAIT_SECONDS)
