"""The running turn: the session it works on, the time it has, and what runs in each of its tasks.

``RunContext`` holds one turn's session (document, memory, step states, cursor, flow context) and the
services the engine lends it; ``Flow`` and ``Step`` accessors read and write through it. Context
variables carry what differs per asyncio task: the deadline, the model call running, nested step frames
and a parallel worker's isolated view.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from langchain_core.messages import BaseMessage, SystemMessage

from picoflow.errors import PicoFlowError, TurnDeadlineError
from picoflow.files.refs import FileRef, digest_of
from picoflow.files.store import FileStore
from picoflow.messages import from_message_doc, to_message_doc
from picoflow.models.registry import ModelSelection
from picoflow.protocols import FlowView, StepLike
from picoflow.session.document import (
    SESSION_DOC_VERSION,
    FlowDoc,
    MessageDoc,
    NamespaceDoc,
    SequenceItem,
    SessionDoc,
    StepDoc,
    validate_namespace,
)

if TYPE_CHECKING:
    from picoflow.events import EventSink
    from picoflow.models.registry import ProviderRegistry
    from picoflow.parallel import CancellationSignal

T = TypeVar("T")

def step_name(target: Any) -> str:
    """Normalise a step class, step or name to the registered name (a step is known by its ``id``)."""
    if isinstance(target, str):
        name = target.strip()
        if not name:
            raise PicoFlowError("go() requires a non-empty Step name.")
        return name
    name = getattr(target, "id", None)
    if isinstance(name, str) and name:
        return name
    raise PicoFlowError("go() requires a Step class with a non-empty id.")


# -- the deadline -------------------------------------------------------------------------------

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


# -- the model call running ---------------------------------------------------------------------

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


# -- state --------------------------------------------------------------------------------------

def read_path(data: Any, path: str | None) -> Any:
    """Read a dotted path (``a.b.0.c``) from nested dicts and lists; ``None`` when absent."""
    if path is None:
        return data
    current = data
    for part in path.split("."):
        if isinstance(current, dict):
            current = current.get(part)
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
        if current is None:
            return None
    return current


def deep_merge(target: dict[str, Any], incoming: dict[str, Any]) -> dict[str, Any]:
    """Merge ``incoming`` into ``target`` in place: nested dicts merge, everything else replaces."""
    for key, value in incoming.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


# -- memory -------------------------------------------------------------------------------------

DEFAULT_SUMMARY_MIN_MESSAGES = 16
DEFAULT_SUMMARY_RECENT_MESSAGES = 8
MIN_SUMMARY_MIN_MESSAGES = 8


@dataclass(frozen=True)
class SummaryConfig:
    """When a namespace is compacted and how many of its newest messages are kept verbatim.

    A namespace is compacted once its history, the system slot at index 0 included, has reached
    ``min_messages`` messages; ``recent_messages`` is how many of the newest ones survive a compaction
    unchanged.
    """

    min_messages: int = DEFAULT_SUMMARY_MIN_MESSAGES
    recent_messages: int = DEFAULT_SUMMARY_RECENT_MESSAGES

    def __post_init__(self) -> None:
        if not _is_int(self.min_messages) or self.min_messages < MIN_SUMMARY_MIN_MESSAGES:
            raise ValueError(
                f"min_messages must be an integer >= {MIN_SUMMARY_MIN_MESSAGES}, got {self.min_messages!r}"
            )
        upper = self.min_messages - 2
        if not _is_int(self.recent_messages) or not 1 <= self.recent_messages <= upper:
            raise ValueError(
                f"recent_messages must be an integer from 1 to {upper} (min_messages - 2), got {self.recent_messages!r}"
            )


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True is not a message count
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Namespace:
    """One namespace's live history; index 0 is the system slot."""

    messages: list[BaseMessage] = field(default_factory=lambda: [SystemMessage(content="")])
    summary: str | None = None
    summarized_through_id: str | None = None
    # The stored form of each message loaded from the document, keyed by the message object's id(); stored
    # messages are history and are never edited in place, so saving can reuse these instead of re-encoding.
    stored: dict[int, tuple[BaseMessage, MessageDoc]] = field(default_factory=dict, repr=False)

    def erase(self) -> list[BaseMessage]:
        """Drop every message but the system slot; the summary is a separate record and stays."""
        del self.messages[1:]
        return self.messages

    def dump(self) -> NamespaceDoc:
        return NamespaceDoc(
            messages=[self._stored_form(message) for message in self.messages],
            summary=self.summary,
            summarized_through_id=self.summarized_through_id,
        )

    def _stored_form(self, message: BaseMessage) -> MessageDoc:
        known = self.stored.get(id(message))
        return known[1] if known is not None and known[0] is message else to_message_doc(message)


class Memory:
    """All namespaces of one flow, and which of them are compacted into rolling summaries."""

    def __init__(self) -> None:
        # A namespace stays in its stored form until a step touches it: most turns read one namespace.
        self._spaces: dict[str, Namespace | NamespaceDoc] = {}
        self.summary_model: ModelSelection | None = None
        self.summary_config = SummaryConfig()
        self.summary_namespaces: set[str] = set()

    def set_summary_model(self, selection: ModelSelection | dict) -> Memory:
        """The model that writes rolling summaries (resolved through the engine's providers)."""
        self.summary_model = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return self

    def set_summary_config(self, min_messages: int = 16, recent_messages: int = 8) -> Memory:
        """Compact once a history (system slot included) reaches ``min_messages``, keeping ``recent_messages``."""
        self.summary_config = SummaryConfig(min_messages=min_messages, recent_messages=recent_messages)
        return self

    def enable_summary(self, namespace: str) -> Memory:
        """Opt one namespace into compaction."""
        self.summary_namespaces.add(validate_namespace(namespace))
        return self

    def namespace(self, name: str) -> Namespace:
        """The live namespace, created (with its system slot) on first use."""
        space = self._spaces.get(name)
        if space is None:
            space = self._spaces[validate_namespace(name)] = Namespace()
        elif isinstance(space, NamespaceDoc):
            space = self._spaces[name] = _hydrate(space)
        return space

    def clear_summary(self, name: str) -> None:
        """Forget the rolling summary of namespace ``name``; its messages stay."""
        space = self.namespace(name)
        space.summary = None
        space.summarized_through_id = None

    def messages(self, name: str) -> list[BaseMessage]:
        return self.namespace(name).messages

    def names(self) -> list[str]:
        return list(self._spaces)

    def load(self, docs: dict[str, NamespaceDoc]) -> None:
        """Hydrate from the persisted ``flow.memory`` map."""
        self._spaces = dict(docs)

    def dump(self) -> dict[str, NamespaceDoc]:
        """The persisted ``flow.memory`` map."""
        return {
            name: space if isinstance(space, NamespaceDoc) else space.dump() for name, space in self._spaces.items()
        }


def _hydrate(doc: NamespaceDoc) -> Namespace:
    pairs = [(from_message_doc(m), m) for m in doc.messages]
    messages = [message for message, _ in pairs]
    if not messages or not isinstance(messages[0], SystemMessage):
        messages.insert(0, SystemMessage(content=""))
    stored = {id(message): (message, stored) for message, stored in pairs}
    return Namespace(messages, doc.summary, doc.summarized_through_id, stored)


# -- files -------------------------------------------------------------------------------------


class TurnFiles:
    """The files of one turn and a cache of file bytes, seeded with what the intake already read
    (and checked).

    ``read`` fetches a referenced file from ``store`` once per turn (an earlier turn's file too) and hands
    back None when it is gone or no longer has the referenced digest.
    """

    def __init__(
        self, store: FileStore | None, attached: Sequence[FileRef] = (), data: Mapping[str, bytes] | None = None
    ) -> None:
        self.store = store
        #: The files the user attached to this turn's message.
        self.attached: list[FileRef] = list(attached)
        self._pending = list(attached)
        self._cache: dict[str, bytes | None] = dict(data or {})

    def take_attached(self) -> list[FileRef]:
        """The attached files, once: the first message built from the user's input carries them."""
        pending, self._pending = self._pending, []
        return pending

    async def read(self, ref: FileRef) -> bytes | None:
        """The bytes of ``ref``, or None when the store no longer holds exactly them."""
        if ref.id not in self._cache:
            data = None if self.store is None else await self.store.read(ref.id, ref.size)
            self._cache[ref.id] = data if data is not None and digest_of(data) == ref.digest else None
        return self._cache[ref.id]


# -- what runs in each task ---------------------------------------------------------------------

#: State keys the framework owns: a step's transient data (never persisted), its prompt and its save time.
TRANSIENT_KEY = "_transient"
PROMPT_KEY = "_prompt"
SAVE_ON_KEY = "_saveOn"

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
    decision_providers: Mapping[str, Any]
    retry_delay: float
    model_loop: Callable[[Any, str | None], Awaitable[Any]]
    run_child: Callable[[Any, Any, str | None], Awaitable[Any]]
    run_steps: Callable[..., Awaitable[Any]]
    decide: Callable[[Any], Awaitable[Any]]
    #: Saves the session through the engine's save path (compaction, size checks, the conditional write).
    save: Callable[[], Awaitable[None]]
    #: Runs the first turn of a new session of a registered flow.
    start: Callable[[str, str | None, dict[str, Any]], Awaitable[Any]]


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
        self.steps: dict[str, Any] = {}
        self.tools: dict[str, Any] = {}
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

    def view(self, flow: Any) -> FlowView:
        """The flow's own view of this data, or the isolated view of the parallel worker running this task."""
        return worker_view(flow) or self.shared

    def state_of(self, step: Any) -> dict[str, Any]:
        """The live state of ``step``: a worker's private copy inside its own task, else the registered one."""
        view = worker_view(step.flow)
        if view is not None and view.worker is not None and view.worker.step is step:
            return view.local[step.id]
        return self.states.setdefault(step.id, {})

    def require_doc(self) -> SessionDoc:
        if self.doc is None:
            raise PicoFlowError("The session document is not loaded yet.")
        return self.doc

    def require_services(self) -> TurnServices:
        if self.services is None:
            raise PicoFlowError("The flow is not running a turn.")
        return self.services

    def require_tool(self, name: str, flow_id: str) -> Any:
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


class SharedView:
    """The flow's own view of its running session: reads and writes pass straight through, nothing is refused."""

    worker = None

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
