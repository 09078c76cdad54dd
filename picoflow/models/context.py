"""Which step a model call is made for, so a test model can answer each step from its own replies."""

from __future__ import annotations

import contextvars

#: The id of the step whose model call is running in this task; None outside step calls (e.g. summaries).
calling_step: contextvars.ContextVar[str | None] = contextvars.ContextVar("picoflow_calling_step", default=None)
