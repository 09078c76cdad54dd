"""Structural types: what lower modules need of a step, a flow, a worker's view and the turn machinery.

Typing against these instead of importing ``Step``, ``Flow`` or the turn keeps every import pointing down.
Framework types that would import back into this module (memory, transitions, results) appear as ``Any``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from picoflow.models.registry import ProviderRegistry
    from picoflow.parallel import ParallelInvocation
    from picoflow.session.document import SessionDoc


class Named(Protocol):
    """Anything registered under a name: a step or step class, a flow."""

    # Read-only, so a class attribute (``Step.id``, ``Flow.id``) satisfies it.
    @property
    def id(self) -> str: ...


class StepLike(Named, Protocol):
    """A registered step instance, as execution bookkeeping sees it."""

    flow: Any

    def get_state(self, path: str | None = None) -> Any: ...


class Worker(Protocol):
    """One ``run_steps()`` worker: its step instance, its invocation and its state-channel contributions."""

    step: StepLike
    invocation: ParallelInvocation

    def contribute(self, name: str, value: Any) -> None:
        """Record a contribution of the worker's step to its state channel ``name``."""


class FlowView(Protocol):
    """How flow and step accessors reach the flow's shared data.

    The flow's own view passes straight through; a ``run_steps()`` worker swaps in an isolated view that
    reads snapshots, keeps private copies and refuses writes to what it does not own.
    """

    flow: Any
    #: The worker this view isolates; None for the flow's own view.
    worker: Worker | None

    def memory(self) -> Any:
        """The ``Memory`` container this task reads and writes."""

    def session_doc(self, doc: SessionDoc) -> SessionDoc:
        """The session document as this task may see it."""

    def step_state(self, step: StepLike, key: str | None) -> Any:
        """A registered step's state (or one dotted path in it)."""

    def state_owner(self, step: StepLike) -> StepLike:
        """The instance whose state a write to the registered ``step`` lands on."""

    def forbid(self, message: str) -> None:
        """Refuse a change to shared data this view does not own (nothing to refuse in the flow's own view)."""

    def record_write(self, step: StepLike, fields: Sequence[str]) -> None:
        """Check a state write on ``step`` and remember which fields it replaces."""


class ProviderSet(Protocol):
    """The model and decision providers an engine serves its flows with; registration checks steps against them."""

    providers: ProviderRegistry
    #: Decision providers (``DecisionProvider``) by the provider name a decision configuration gives.
    decision_providers: Mapping[str, Any]
