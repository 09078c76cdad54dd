"""The turn runtime the engine binds onto a flow: what authoring methods reach without importing the turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from picoflow.files.reader import TurnFiles
from picoflow.flow import Flow
from picoflow.models.registry import ProviderRegistry
from picoflow.results import RunResponse
from picoflow.session.document import SessionDoc
from picoflow.step import Step
from picoflow.transitions import Transition
from picoflow.turn.loop import run_model_loop

if TYPE_CHECKING:
    from picoflow.decision import DecisionProvider
    from picoflow.decision_step import DecisionStep
    from picoflow.parallel import ParallelBatchResult


@dataclass
class TurnRuntime:
    """One turn's services: its document, the model providers, and the engine's save and run paths.

    Nested, parallel and decision machinery is imported on first use: an ordinary turn never needs it.
    """

    doc: SessionDoc
    providers: ProviderRegistry
    decision_providers: Mapping[str, DecisionProvider]
    retry_delay: float
    #: The engine's save path (compaction, size checks, the conditional write).
    save: Callable[[Flow], Awaitable[None]]
    #: Runs the first turn of a new session of a registered flow.
    start: Callable[[str, str | None, dict[str, Any]], Awaitable[RunResponse]]
    #: The files attached to this turn's message and the bytes read for the turn.
    files: TurnFiles = field(default_factory=lambda: TurnFiles(None))

    async def run_model_loop(self, step: Step, user_message: str | None) -> Any:
        return await run_model_loop(step, user_message)

    async def run_child(self, flow: Flow, target: type[Step] | str, user_message: str | None) -> Any:
        from picoflow.turn.nested import run_child

        return await run_child(flow, target, user_message)

    async def run_steps(self, caller: Step, requests: Sequence[Any], **options: Any) -> ParallelBatchResult:
        from picoflow.turn.parallel import run_batch

        return await run_batch(caller, requests, **options)

    async def decide(self, step: DecisionStep) -> Transition:
        from picoflow.turn.decide import decide

        return await decide(step, self)

    async def checkpoint(self, flow: Flow) -> None:
        await self.save(flow)

    async def start_session(self, flow_name: str, message: str | None, config: dict[str, Any]) -> RunResponse:
        return await self.start(flow_name, message, config)
