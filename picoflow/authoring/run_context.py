"""The running turn: one request's session as flow and step accessors read and write it, and what each task runs.

``RunContext`` holds one turn's session (document, memory, step states, cursor, flow context), its files and
the services the engine lends it. Context variables carry what differs per asyncio task: the nested step
frames and a parallel worker's isolated view.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from picoflow.conversation.memory import Memory
from picoflow.conversation.state import TRANSIENT_KEY, read_path
from picoflow.errors import PicoFlowError
from picoflow.files.turn_files import TurnFiles
from picoflow.models.registry import ModelSelection
from picoflow.session.document import SESSION_DOC_VERSION, FlowDoc, SequenceItem, SessionDoc, StepDoc

if TYPE_CHECKING:
    from picoflow.authoring.decision import DecisionProvider
    from picoflow.authoring.step import Step
    from picoflow.authoring.step_runs import CancellationSignal, ParallelBatchResult, ParallelInvocation
    from picoflow.authoring.step_tools import ToolSpec
    from picoflow.authoring.transitions import Transition
    from picoflow.events import EventSink
    from picoflow.mcp import MCPSessions
    from picoflow.models.registry import ProviderRegistry
    from picoflow.session.journal import TurnJournal


# -- what runs in each task ---------------------------------------------------------------------

@dataclass(frozen=True)
class _TaskScope:
    """What runs in one asyncio task: the nested steps executing, innermost last, and the isolated view of the
    parallel worker the task runs, if any."""

    frames: tuple[Step, ...] = ()
    view: SessionView | None = None


# A task outside any step or worker.
_NO_TASK_SCOPE = _TaskScope()
# A ContextVar because a parallel worker's task must see its own frames and view while its siblings, and the
# flow code they run (which is handed no context), share one flow instance.
_task: contextvars.ContextVar[_TaskScope] = contextvars.ContextVar(
    "picoflow_task", default=_NO_TASK_SCOPE
)


def execution_frames(flow: Any) -> tuple[Step, ...]:
    """The child steps of ``flow`` executing in the current task, outermost first."""
    return tuple(step for step in _task.get().frames if step.flow is flow)


@contextlib.contextmanager
def execution_frame(step: Step) -> Iterator[None]:
    """Make ``step`` the innermost executing step for the duration of the block."""
    scope = _task.get()
    token = _task.set(_TaskScope((*scope.frames, step), scope.view))
    try:
        yield
    finally:
        _task.reset(token)


def worker_view(flow: Any) -> SessionView | None:
    """The isolated view of ``flow`` that the current task runs in, if it is a parallel worker."""
    view = _task.get().view
    return view if view is not None and view.flow is flow else None


def enter_worker_view(view: SessionView) -> None:
    """Run the rest of the current task (a worker's own task) in ``view``."""
    _task.set(_TaskScope(_task.get().frames, view))


def cancellation_signal(flow: Any) -> CancellationSignal | None:
    """The cancellation signal of ``flow``'s parallel worker running in this task, if any."""
    view = worker_view(flow)
    return view.signal if view is not None else None


def ensure_top_level(flow: Any, target: str) -> None:
    """Refuse to route while a nested child executes: only the owning step decides where to go."""
    if not execution_frames(flow):
        return
    message = f"Cannot goto '{target}' from a child execution frame. Return a result to the owning step instead."
    flow.run_context.view(flow).forbid(message)
    raise PicoFlowError(message)


# -- the running session ------------------------------------------------------------------------


@dataclass
class TurnServices:
    """What the engine lends a running turn: its model providers and the turn machinery's entry points.

    Steps reach the machinery through these (``Step.run``'s model loop, ``run_step``, ``run_steps``, a
    decision), so the authoring classes never import the turn that drives them.
    """

    providers: ProviderRegistry
    decision_providers: Mapping[str, DecisionProvider]
    retry_delay: float
    model_loop: Callable[[Any, str | None], Awaitable[Any]]
    run_child: Callable[[Any, Any, str | None], Awaitable[Any]]
    run_steps: Callable[..., Awaitable[ParallelBatchResult]]
    #: Asks a DecisionStep's questions and routes on the answers (``picoflow.turn.decide.decide``).
    decide: Callable[..., Awaitable[Transition]]
    #: Saves the session through the engine's save path (compaction, size checks, the conditional write).
    save: Callable[[], Awaitable[None]]
    #: Runs the first turn of a new session of a registered flow.
    start: Callable[[str, str | None, dict[str, Any]], Awaitable[Any]]
    #: The engine's MCP sessions, which calls of MCP server tools go through.
    mcp: MCPSessions
    #: The effect journal of this turn (``picoflow.session.journal.TurnJournal``); None: no effect tool can run.
    journal: TurnJournal | None = None


class RunContext:
    """One request's running session: what a turn reads and changes before the document is saved.

    A flow creates its own when it is instantiated (steps and memory are configured before any session is
    loaded); ``bind`` loads a session document into it and ``write_back`` copies it back for the save.
    """

    def __init__(self) -> None:
        self.doc: SessionDoc | None = None
        self.memory = Memory()
        #: The flow context (``get_context``): the request config under ``config`` and what flows add.
        self.values: dict[str, Any] = {}
        #: Registered steps and the flow-wide tool registry (``ToolSpec``s), by name.
        self.steps: dict[str, Step] = {}
        self.tools: dict[str, ToolSpec] = {}
        #: Each registered step's durable state (and its ``_transient`` part), by step id.
        self.states: dict[str, dict[str, Any]] = {}
        #: Models stored for steps that had their own; a session keeps the models it started with.
        self.step_models: dict[str, ModelSelection] = {}
        #: The flow's model once known: the stored one, else ``config_model()``.
        self.model: ModelSelection | None = None
        self.current: str | None = None
        self.sequence: list[SequenceItem] = []
        self.files = TurnFiles(None)
        self.services: TurnServices | None = None
        #: Where the turn's events go while a client reads them as they happen (``FlowEngine.stream``); else None.
        self.events: EventSink | None = None
        self.shared = SharedView(self)

    # -- views ----------------------------------------------------------------------------------

    def view(self, flow: Any) -> SessionView:
        """The flow's own view of this data, or the isolated view of the parallel worker running this task."""
        return worker_view(flow) or self.shared

    def state_of(self, step: Any) -> dict[str, Any]:
        """The live state of ``step``: a worker's private copy inside its own task, else the registered one."""
        view = worker_view(step.flow)
        if view is not None and view.worker is not None and view.worker.step is step:
            return view.worker.local[step.id]
        return self.states.setdefault(step.id, {})

    def require_doc(self) -> SessionDoc:
        if self.doc is None:
            raise PicoFlowError("The session document is not loaded yet.")
        return self.doc

    def require_services(self) -> TurnServices:
        if self.services is None:
            raise PicoFlowError("The flow is not running a turn.")
        return self.services

    def require_tool(self, name: str, flow_id: str) -> ToolSpec:
        spec = self.tools.get(name)
        if spec is None:
            raise PicoFlowError(f"Tool '{name}' is not defined in flow '{flow_id}'.")
        return spec

    # -- the session document -------------------------------------------------------------------

    def bind(self, doc: SessionDoc, services: TurnServices | None = None, files: TurnFiles | None = None) -> None:
        """Load a (stored or freshly created) session document for a turn served by ``services``."""
        self.doc, self.services = doc, services
        if files is not None:
            self.files = files
        stored = doc.flow
        if stored.model is not None:
            self.model = ModelSelection.from_doc(stored.model)
        self.values = copy.deepcopy(stored.context)
        self.memory.load(stored.memory)
        for step_doc in stored.steps:
            if step_doc.name in self.steps:
                self.states[step_doc.name] = copy.deepcopy(step_doc.state)
                if step_doc.model is not None:
                    self.step_models[step_doc.name] = ModelSelection.from_doc(step_doc.model)
        if stored.current_step is not None and stored.current_step not in self.steps:
            raise PicoFlowError(f"Step '{stored.current_step}' is not defined in flow '{stored.name}'.")
        self.current = stored.current_step
        self.sequence = [item.model_copy() for item in stored.sequence]

    def write_back(self, flow_id: str, model: ModelSelection) -> SessionDoc:
        """Copy the running session into its document, ready to be saved."""
        doc = self.require_doc()
        stored_steps = {s.name: s for s in doc.flow.steps}
        for step in self.steps.values():
            state = {k: copy.deepcopy(v) for k, v in self.states.get(step.id, {}).items() if k != TRANSIENT_KEY}
            own = None
            if not step.is_logic():
                selection = step.model_selection()
                own = selection.to_doc() if selection != model else None
            stored_steps[step.id] = StepDoc(name=step.id, state=state, model=own)
        doc.flow = FlowDoc(
            name=flow_id,
            model=model.to_doc(),
            context=copy.deepcopy(self.values),
            memory=self.memory.dump(),
            steps=list(stored_steps.values()),
            current_step=self.current,
            sequence=list(self.sequence),
        )
        doc.version = SESSION_DOC_VERSION
        return doc


class Worker(Protocol):
    """A parallel worker as its step reaches it (``picoflow.turn.worker.WorkerView``)."""

    @property
    def step(self) -> Step:
        """The worker's own step instance."""

    @property
    def invocation(self) -> ParallelInvocation:
        """Its params, branch key, request index, path and cancellation signal."""

    @property
    def local(self) -> dict[str, dict[str, Any]]:
        """The private copies of the step states it changes, by step id."""

    def contribute(self, name: str, value: Any) -> None:
        """Add ``value`` to its step's channel ``name``."""


class SessionView(Protocol):
    """How flow code reaches a running session: the flow's own shared view, or a parallel worker's isolated one
    (``picoflow.turn.worker.WorkerView``), which copies what it reads and refuses writes outside its step."""

    @property
    def flow(self) -> Any:
        """The flow whose worker this view isolates; None for the shared view, which is never a task's own."""

    @property
    def worker(self) -> Worker | None:
        """The worker this view isolates; None for the shared view."""

    @property
    def signal(self) -> CancellationSignal | None:
        """The worker's cancellation signal; None for the shared view."""

    def memory(self) -> Memory:
        """The memory flow code reads and writes."""

    def session_doc(self, doc: SessionDoc) -> SessionDoc:
        """The session document as flow code may see it."""

    def step_state(self, step: Any, key: str | None) -> Any:
        """The state of ``step`` (at ``key``) as flow code may read it."""

    def state_owner(self, step: Step) -> Step:
        """The step instance that keeps ``step``'s state in this view."""

    def forbid(self, message: str) -> None:
        """Refuse an action this view does not allow (a worker raises; the shared view allows everything)."""

    def record_write(self, step: Any, fields: Sequence[str]) -> None:
        """Note that flow code wrote ``fields`` of ``step``'s state (a worker refuses another step's)."""


class SharedView:
    """The flow's own view of its running session: reads and writes pass straight through, nothing is refused."""

    # No task runs in the shared view as its own: it isolates no flow's worker and has no worker to cancel.
    flow = None
    worker = None
    signal = None

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def memory(self) -> Memory:
        return self.context.memory

    def session_doc(self, doc: SessionDoc) -> SessionDoc:
        return doc

    def step_state(self, step: Any, key: str | None) -> Any:
        return read_path(self.context.state_of(step), key)

    def state_owner(self, step: Any) -> Any:
        return step

    def forbid(self, message: str) -> None:
        return None

    def record_write(self, step: Any, fields: Sequence[str]) -> None:
        return None
