"""What runs in the current asyncio task: its nested step frames and, inside a parallel worker, its view.

Context variables give every worker task its own values, where attributes of the shared flow would not.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from picoflow.protocols import FlowView, StepLike

if TYPE_CHECKING:
    from picoflow.parallel import CancellationSignal

# The nested steps executing in this task, innermost last.
_frames: contextvars.ContextVar[tuple[StepLike, ...]] = contextvars.ContextVar("picoflow_frames", default=())
# The isolated view of the parallel worker this task runs, if any.
_worker_view: contextvars.ContextVar[FlowView | None] = contextvars.ContextVar("picoflow_worker_view", default=None)


def execution_frames(flow: Any) -> tuple[StepLike, ...]:
    """The child steps of ``flow`` executing in the current task, outermost first."""
    return tuple(step for step in _frames.get() if step.flow is flow)


@contextlib.contextmanager
def execution_frame(step: StepLike) -> Iterator[None]:
    """Make ``step`` the innermost executing step for the duration of the block."""
    token = _frames.set((*_frames.get(), step))
    try:
        yield
    finally:
        _frames.reset(token)


def worker_view(flow: Any) -> FlowView | None:
    """The isolated view of ``flow`` that the current task runs in, if it is a parallel worker."""
    view = _worker_view.get()
    return view if view is not None and view.flow is flow else None


def enter_worker_view(view: FlowView) -> None:
    """Run the rest of the current task (a worker's own task) in ``view``."""
    _worker_view.set(view)


def cancellation_signal(flow: Any) -> CancellationSignal | None:
    """The cancellation signal of ``flow``'s parallel worker running in this task, if any."""
    view = worker_view(flow)
    return view.worker.invocation.signal if view is not None and view.worker is not None else None
