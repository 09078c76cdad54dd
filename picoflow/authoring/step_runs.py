"""Parallel and nested execution values: requests, results, invocations, cancellation and state channels.

``Step.run_steps()`` forks one fresh worker per request; the turn runs them (``picoflow.turn.parallel``).
A worker sees a read-only snapshot of the flow taken at the fork, owns a private copy of its own state and
memory, and proposes state changes that the join validates and publishes in request order.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from picoflow.errors import ParallelCancelledError, ParallelExecutionError, ParallelStateConflictError

FailurePolicy = Literal["retain-successes", "atomic"]
Checkpoint = Literal["none", "root-join"]


class CancellationSignal:
    """A cooperative cancellation flag; cancelling it also cancels every signal linked below it."""

    def __init__(self, *parents: CancellationSignal | None) -> None:
        self._event = asyncio.Event()
        self._children: list[CancellationSignal] = []
        self.reason: str | None = None
        for parent in parents:
            if parent is None:
                continue
            parent._children.append(self)
            if parent.cancelled:
                self.cancel(parent.reason or "cancelled")

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        if self._event.is_set():
            return
        self.reason = reason
        self._event.set()
        for child in self._children:
            child.cancel(reason)

    async def wait(self) -> None:
        """Return once the signal is cancelled."""
        await self._event.wait()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise ParallelCancelledError(f"The work was cancelled: {self.reason}.")


# -- requests and results ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStepRequest:
    """One child invocation of ``run_steps()``; ``key`` is required when the class appears more than once."""

    step: Any
    key: str | None = None
    params: Mapping[str, Any] | None = None
    user_message: str | None = None


@dataclass(frozen=True)
class ParallelInvocation:
    """What a worker knows about its own invocation (``Step.get_parallel_invocation()``)."""

    params: Mapping[str, Any]
    key: str
    index: int
    path: tuple[int, ...]
    signal: CancellationSignal


@dataclass(frozen=True)
class BranchResult:
    """The outcome of one request, in request order."""

    index: int
    key: str
    step: str
    status: Literal["fulfilled", "rejected"]
    output: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class ParallelBatchResult:
    """All branches in request order, whether their state was published and whether the batch was cancelled."""

    branches: tuple[BranchResult, ...]
    published: bool
    checkpointed: bool = False
    cancelled: bool = False

    @property
    def fulfilled(self) -> tuple[BranchResult, ...]:
        return tuple(branch for branch in self.branches if branch.status == "fulfilled")

    @property
    def rejected(self) -> tuple[BranchResult, ...]:
        return tuple(branch for branch in self.branches if branch.status == "rejected")


def check_json(value: Any, what: str) -> None:
    """Raise ``ParallelExecutionError`` unless ``value`` is plain JSON data."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ParallelExecutionError(f"{what} is not JSON-compatible: {exc}") from exc


# -- state channels ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contribution:
    """One ``contribute_state()`` call, ordered at the join by its request path."""

    path: tuple[int, ...]
    key: str
    step_id: str
    channel: str
    value: Any


@dataclass(frozen=True)
class StateChannel:
    """How contributions to one state field combine: ``reduce(current, value, branch_key) -> new``."""

    reduce: Callable[[Any, Any, str], Any]
    single_writer: bool = False


def _sum(current: Any, value: Any, _key: str) -> Any:
    for operand in (current, value):
        if isinstance(operand, bool) or not isinstance(operand, int | float):
            raise TypeError(f"sum() adds numbers, got {type(operand).__name__}")
    return current + value


def _append(current: Any, value: Any, _key: str) -> list[Any]:
    return [*current, value]


def _keyed(current: Any, value: Any, key: str) -> dict[str, Any]:
    if key in current:
        raise ParallelStateConflictError(f"Two contributions are keyed by branch '{key}'.")
    return {**current, key: value}


def _merge_record(current: Any, value: Any, _key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"merge_record() merges dicts, got {type(value).__name__}")
    return {**current, **value}


class StepChannels:
    """Built-in reducers for ``Step.parallel_state_channels()``."""

    @staticmethod
    def single_writer() -> StateChannel:
        """At most one contribution per join; a second one is a conflict."""
        return StateChannel(lambda _current, value, _key: value, single_writer=True)

    @staticmethod
    def reduced(reducer: Callable[[Any, Any], Any], initial: Any = None) -> StateChannel:
        """A custom reducer ``reducer(current, value)``; ``initial`` stands in for a missing field."""

        def reduce(current: Any, value: Any, _key: str) -> Any:
            return reducer(copy.deepcopy(initial) if current is None else current, value)

        return StateChannel(reduce)

    @staticmethod
    def sum() -> StateChannel:
        """Add numbers to the field (a missing field counts as 0)."""
        return StateChannel(lambda current, value, key: _sum(0 if current is None else current, value, key))

    @staticmethod
    def append() -> StateChannel:
        """Append each contribution to a list."""
        return StateChannel(lambda current, value, key: _append(current or [], value, key))

    @staticmethod
    def append_unique_by(identity: str | Callable[[Any], Any]) -> StateChannel:
        """Append contributions whose identity (a dict field name or a function) is not in the list yet."""

        def ident(item: Any) -> Any:
            if callable(identity):
                return identity(item)
            return item.get(identity) if isinstance(item, Mapping) else item

        def reduce(current: Any, value: Any, _key: str) -> list[Any]:
            items = list(current or [])
            if any(ident(item) == ident(value) for item in items):
                return items
            return [*items, value]

        return StateChannel(reduce)

    @staticmethod
    def keyed_by_branch() -> StateChannel:
        """A dict of contributions keyed by the contributing branch's key."""
        return StateChannel(lambda current, value, key: _keyed(current or {}, value, key))

    @staticmethod
    def merge_record() -> StateChannel:
        """Shallow-merge dict contributions into a dict, later request paths winning."""
        return StateChannel(lambda current, value, key: _merge_record(current or {}, value, key))


# -- limits --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelSettings:
    """Limits of nested execution (``Flow.config_parallel_execution()``)."""

    max_depth: int = 8
    max_invocations: int = 256
    cancellation_grace_ms: int = 1000


def parallel_settings(config: Mapping[str, Any] | None) -> ParallelSettings:
    """Checked limits from a flow's ``config_parallel_execution()``."""
    try:
        settings = ParallelSettings(**(config or {}))
    except TypeError as exc:
        raise ParallelExecutionError(f"Invalid config_parallel_execution(): {exc}") from exc
    for name, minimum in (("max_depth", 1), ("max_invocations", 1), ("cancellation_grace_ms", 0)):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ParallelExecutionError(f"config_parallel_execution() {name} must be an integer >= {minimum}.")
    return settings


def check_depth(settings: ParallelSettings, flow_id: str, depth: int) -> None:
    """Refuse nesting deeper than the flow allows (``depth`` 1 is a direct child of the turn's step)."""
    if depth > settings.max_depth:
        raise ParallelExecutionError(
            f"Nested execution in flow '{flow_id}' is limited to a depth of {settings.max_depth}."
        )
