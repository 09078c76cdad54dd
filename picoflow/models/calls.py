"""Which model call runs in this task: its purpose, the step it answers for and the time it must answer by,
kept in the task's ``picoflow.deadline.CallScope`` beside the turn's deadline."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from picoflow.deadline import CallPurpose, CallScope, current_scope, scoped

__all__ = ["CALL_PURPOSES", "CallPurpose", "model_call_for"]

CALL_PURPOSES: tuple[CallPurpose, ...] = ("chat", "decision", "summary", "judge")


def model_call_for(purpose: CallPurpose, step: str | None,
                   timeout: float | None = None) -> contextlib.AbstractContextManager[CallScope]:
    """Mark the model calls made inside the block as ``purpose`` calls of ``step`` (None: of no step), to answer
    within ``timeout`` seconds (None: no limit but the client's own); the turn's deadline still applies."""
    call_deadline = None if timeout is None else time.monotonic() + timeout
    return scoped(replace(current_scope(), purpose=purpose, step=step, call_deadline=call_deadline))
