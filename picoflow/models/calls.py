"""Which model call runs in this task: its purpose, the step it answers for, and the time it must answer by."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Literal

#: Why a model is called: a step's reply (``chat``), a DecisionStep's questions (``decision``), a memory
#: compaction's rolling summary (``summary``) or ``picoflow eval`` scoring a reply against a scenario (``judge``).
CallPurpose = Literal["chat", "decision", "summary", "judge"]
CALL_PURPOSES: tuple[CallPurpose, ...] = ("chat", "decision", "summary", "judge")

#: The id of the step whose model call is running in this task; None outside step calls (e.g. summaries).
calling_step: contextvars.ContextVar[str | None] = contextvars.ContextVar("picoflow_calling_step", default=None)
#: The purpose of the model call running in this task (a step's own calls are chat calls).
call_purpose: contextvars.ContextVar[CallPurpose] = contextvars.ContextVar("picoflow_call_purpose", default="chat")
#: The ``time.monotonic()`` time by which the running model call must answer; None: no limit but the client's own.
call_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("picoflow_call_deadline", default=None)


@contextlib.contextmanager
def model_call_for(purpose: CallPurpose, step: str | None) -> Iterator[None]:
    """Mark the model calls made inside the block as ``purpose`` calls of ``step`` (None: of no step)."""
    purpose_token = call_purpose.set(purpose)
    step_token = calling_step.set(step)
    try:
        yield
    finally:
        calling_step.reset(step_token)
        call_purpose.reset(purpose_token)

