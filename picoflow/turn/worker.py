"""The isolated view a ``run_steps()`` worker runs in: read-only snapshots of the shared state, private copies of
what it writes, its own memory, and the invocation budget it shares with its batch."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from datetime import date, datetime
from enum import Enum
from typing import Any, NoReturn, cast

from picoflow.authoring.flow import Flow
from picoflow.authoring.run_context import worker_view
from picoflow.authoring.step import Step
from picoflow.authoring.step_runs import CancellationSignal, Contribution, ParallelInvocation, StateChannel, check_json
from picoflow.conversation.memory import Memory, Namespace
from picoflow.conversation.state import SAVE_ON_KEY, TRANSIENT_KEY, read_path
from picoflow.errors import ParallelExecutionError, ParallelMutationError
from picoflow.session.document import SequenceItem, SessionDoc, validate_namespace

# Framework-owned state keys: stamped at publication or never published at all.
_UNPUBLISHED_FIELDS = frozenset({SAVE_ON_KEY, TRANSIENT_KEY})
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "sort", "reverse",
     "add", "discard"}
)
_SCALARS = (str, bytes, int, float, bool, type(None), datetime, date, Enum)


def read_only(value: Any, scope: WorkerView) -> Any:
    """``value`` itself when it is immutable, else a view whose every write raises ``ParallelMutationError``."""
    # Methods pass through: the pydantic ones a worker would call (model_dump, model_copy) return copies.
    if isinstance(value, _SCALARS) or callable(value):
        return value
    return ReadOnlyView(value, scope)


class ReadOnlyView:
    """A read-through view of shared data handed to a worker; writes are refused and recorded."""

    __slots__ = ("_scope", "_target")
    _scope: WorkerView
    _target: Any

    def __init__(self, target: Any, scope: WorkerView) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_scope", scope)

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        self._scope.refuse("A run_steps() worker cannot change a shared snapshot (session, context or params).")

    def __getattr__(self, name: str) -> Any:
        if name in _MUTATORS:
            self._refuse()
        return read_only(getattr(self._target, name), self._scope)

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _refuse

    def __getitem__(self, key: Any) -> Any:
        return read_only(self._target[key], self._scope)

    def get(self, key: Any, default: Any = None) -> Any:
        return read_only(self._target.get(key, default), self._scope)

    def keys(self) -> Any:
        return self._target.keys()

    def values(self) -> list[Any]:
        return [read_only(value, self._scope) for value in self._target.values()]

    def items(self) -> list[tuple[Any, Any]]:
        return [(key, read_only(value, self._scope)) for key, value in self._target.items()]

    def __iter__(self) -> Iterator[Any]:
        return (read_only(item, self._scope) for item in self._target)

    def __len__(self) -> int:
        return len(self._target)

    def __contains__(self, item: Any) -> bool:
        return item in self._target

    def __eq__(self, other: Any) -> bool:
        return bool(self._target == (other._target if isinstance(other, ReadOnlyView) else other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadOnlyView({self._target!r})"


class WorkerMemory(Memory):
    """A worker's private memory: each namespace is cloned from the parent's view on first use."""

    def __init__(self, source: Memory, scope: WorkerView) -> None:
        super().__init__()
        self._source = source
        self._scope = scope
        self.summary_model = source.summary_model
        self.summary_config = source.summary_config
        self.summary_namespaces = set(source.summary_namespaces)

    def namespace(self, name: str) -> Namespace:
        # Only namespaces: a worker's memory never loads stored documents.
        space = self._spaces.get(name)
        if isinstance(space, Namespace):
            return space
        inherited = name in self._source.names()
        space = copy.deepcopy(self._source.namespace(name)) if inherited else Namespace()
        self._spaces[validate_namespace(name)] = space
        return space

    def names(self) -> list[str]:
        return list(dict.fromkeys([*self._spaces, *self._source.names()]))

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        self._scope.refuse("A run_steps() worker cannot replace or reconfigure the flow memory.")

    set_summary_model = set_summary_config = enable_summary = load = _refuse


class Budget:
    """The invocation allowance shared by a root batch and every batch nested in it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, count: int) -> None:
        if self.used + count > self.limit:
            raise ParallelExecutionError(f"run_steps() is limited to {self.limit} invocations per root batch.")
        self.used += count


class WorkerView:
    """Everything private to one worker: its step instance, state view, memory and proposed changes.

    It is the flow's view for as long as the worker's task runs, and the worker's ``Worker`` record too.
    """

    def __init__(
        self,
        flow: Flow,
        step: Step,
        *,
        shared: Mapping[str, dict[str, Any]],
        memory_source: Memory,
        budget: Budget,
        level: int,
    ) -> None:
        self.flow = flow
        self.step = step
        self.worker = self
        self.invocation: ParallelInvocation
        self.shared = shared
        self.local: dict[str, dict[str, Any]] = {}
        self.touched: dict[str, set[str]] = {}
        self.contributions: list[Contribution] = []
        self.sequence: list[SequenceItem] = []
        self.private_memory = WorkerMemory(memory_source, self)
        self.budget = budget
        self.level = level
        self.violation: ParallelMutationError | None = None

    @property
    def signal(self) -> CancellationSignal:
        return self.invocation.signal

    # -- the flow's view -------------------------------------------------------------------------

    def memory(self) -> Memory:
        return self.private_memory

    def session_doc(self, doc: SessionDoc) -> SessionDoc:
        # The read-only view stands in for the document: reads pass through, writes are refused.
        return cast(SessionDoc, read_only(doc, self))

    def step_state(self, step: Step, key: str | None) -> Any:
        # A copy of the snapshot: the worker must never reach the live state of another step.
        return copy.deepcopy(read_path(self.read(step.id), key))

    def state_owner(self, step: Step) -> Step:
        # The worker's own step keeps its state on the worker instance, not on the registered one.
        return self.step if self.step.id == step.id else step

    def forbid(self, message: str) -> NoReturn:
        self.refuse(message)

    def record_write(self, step: Step, fields: Sequence[str]) -> None:
        if step is not self.step:
            self.refuse(f"A run_steps() worker cannot change the state of step '{step.id}'; only its own.")
        self.touched.setdefault(step.id, set()).update(f for f in fields if f not in _UNPUBLISHED_FIELDS)

    def contribute(self, name: str, value: Any) -> None:
        step = self.step
        channel_for(self.flow, step.id, name)
        check_json(value, f"The contribution to '{step.id}.{name}'")
        self.contributions.append(
            Contribution(self.invocation.path, self.invocation.key, step.id, name, copy.deepcopy(value))
        )

    # -- the join's bookkeeping ----------------------------------------------------------------

    def read(self, step_id: str) -> dict[str, Any]:
        """This worker's view of a step's state (never copy-free for others: callers copy)."""
        return self.local[step_id] if step_id in self.local else self.shared[step_id]

    def materialize(self, step_id: str) -> dict[str, Any]:
        """A private, writable copy of a step's state, for publication of nested joins into this view."""
        if step_id not in self.local:
            self.local[step_id] = copy.deepcopy(self.shared[step_id])
        return self.local[step_id]

    def refuse(self, message: str) -> NoReturn:
        """Raise ``ParallelMutationError`` and remember it, so the join fails even if the worker catches it."""
        error = ParallelMutationError(message)
        if self.violation is None:
            self.violation = error
        raise error


def new_worker(step: Step) -> Step:
    """A new instance of ``step``'s class for one ``run_steps()`` invocation, configured like the registered one
    (its class's constructor runs, so a step that needs more than a flow cannot be a worker)."""
    worker = type(step)(step.flow)
    for name in step.worker_configuration:
        setattr(worker, name, copy.copy(getattr(step, name)))
    return worker


def channel_for(flow: Flow, step_id: str, name: str) -> StateChannel:
    """The channel ``name`` declared by the registered step ``step_id``."""
    channels = flow.require_step(step_id).parallel_state_channels() or {}
    channel = channels.get(name)
    if not isinstance(channel, StateChannel):
        raise ParallelExecutionError(
            f"Step '{step_id}' declares no state channel '{name}' in parallel_state_channels()."
        )
    return channel




def active_worker(flow: Flow) -> WorkerView | None:
    """The worker whose task is running, when it is one of ``flow``'s."""
    view = worker_view(flow)
    return view if isinstance(view, WorkerView) else None
