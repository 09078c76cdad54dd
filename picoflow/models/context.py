"""What the running model call is for: its step (so a test model can answer each step from its own replies) and
the time by which it must answer (so a client never starts a retry wait that would end after it)."""

from __future__ import annotations

import contextvars

#: The id of the step whose model call is running in this task; None outside step calls (e.g. summaries).
calling_step: contextvars.ContextVar[str | None] = contextvars.ContextVar("picoflow_calling_step", default=None)
#: The ``time.monotonic()`` time by which the running model call must answer; None: no limit but the client's own.
call_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("picoflow_call_deadline", default=None)
