"""Nested execution: run a registered child step inside this turn without moving the cursor."""

from __future__ import annotations

from typing import Any

from picoflow.execution import execution_frame, execution_frames, worker_view
from picoflow.flow import Flow
from picoflow.parallel import RunStepRequest, check_depth, parallel_settings
from picoflow.session.document import SequenceItem
from picoflow.step import Step
from picoflow.turn.parallel import run_batch


async def run_child(flow: Flow, target: type[Step] | str, user_message: str | None = None) -> Any:
    """Run ``target`` in a frame nested in the executing step and return its output.

    Inside a parallel worker this is a one-child atomic barrier, so the child stays isolated too.
    """
    if worker_view(flow) is not None:
        batch = await run_batch(
            flow.get_executing_step(),
            [RunStepRequest(step=target, user_message=user_message)],
            failure_policy="atomic",
        )
        branch = batch.branches[0]
        if branch.error is not None:
            raise branch.error
        return branch.output
    child = flow.require_step(target)
    frames = execution_frames(flow)
    check_depth(parallel_settings(flow.config_parallel_execution()), flow.id, len(frames) + 1)
    flow._extend_sequence([SequenceItem(level=len(frames) + 2, step_name=child.id)])
    with execution_frame(child):
        await child.on_enter()
        try:
            return await child.run(user_message)
        finally:
            await child.on_exit()
