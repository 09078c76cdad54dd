"""One hop of a turn as the turn hands it down: the executing step and what it runs with, read once where the hop
starts.

A hop is a logic step's decision, or one model call with its tool calls. Its model call, tool dispatch and
stream read these fields instead of asking the running session again on every call: which step runs, the
namespace it writes, the parallel worker (and its cancellation signal) the task runs for, and the event sink a
top-level step of a streamed turn writes to.
"""

from __future__ import annotations

from dataclasses import dataclass

from picoflow.authoring.flow import Flow
from picoflow.authoring.run_context import Worker, execution_frames, worker_view
from picoflow.authoring.step import Step
from picoflow.authoring.step_runs import CancellationSignal
from picoflow.conversation.memory import Namespace
from picoflow.errors import PicoFlowError
from picoflow.events import EventSink


@dataclass(frozen=True)
class Hop:
    """The executing step of one hop and its context; built by ``open_hop`` and never changed."""

    flow: Flow
    step: Step
    #: Whether the step runs as a nested child (``run_step``) rather than under the cursor.
    nested: bool
    #: The step's namespace in the view this task runs in; handlers and nested steps append to the same live list.
    space: Namespace
    #: The parallel worker this task runs, if any: only its own step's tool handlers may answer for it.
    worker: Worker | None
    #: That worker's cancellation signal; None outside a worker.
    signal: CancellationSignal | None
    #: The turn's event sink while a top-level step of a streamed turn runs; None in a nested child or a worker.
    sink: EventSink | None


def open_hop(flow: Flow) -> Hop:
    """The hop ``flow`` runs next in this task: its innermost nested step, else the step under the cursor."""
    frames = execution_frames(flow)
    view = worker_view(flow)
    step = frames[-1] if frames else flow.get_current_step()
    if step is None:
        raise PicoFlowError(f"Flow '{flow.id}' has no current step.")
    context = flow.run_context
    events = context.events
    memory = (view or context.shared).memory()
    return Hop(
        flow=flow,
        step=step,
        nested=bool(frames),
        space=memory.namespace(step.namespace),
        worker=view.worker if view is not None else None,
        signal=view.signal if view is not None else None,
        sink=events if events is not None and not frames and view is None else None,
    )
