"""ConcurStep1..4: the parallel follow-up workers that InContextStep fans out with ``run_steps``.

The tree (one ``run_step(InContextStep)`` from NameStep):

    InContextStep.on_enter          level 2, runs ConcurStep1 and ConcurStep2 side by side
      ConcurStep1                   level 3, calls the model, then runs ConcurStep3 from on_response
        ConcurStep3                 level 4
      ConcurStep2                   level 3, runs ConcurStep4 from on_enter, then calls the model
        ConcurStep4                 level 4

Each worker gets its own step class, so each writes only its own state slot and the joins never see two
branches replacing the same field. Workers run on private copies of the memory they read; picoflow throws
those transcripts away at the join, so only state and the returned outputs leave a worker.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from picoflow import Step
from picoflow.authoring.prompts import prompt
from picoflow.authoring.step_runs import ParallelBatchResult, RunStepRequest


class FollowUpParams(BaseModel):
    """What the parent hands each worker through ``RunStepRequest.params``."""

    task: str = Field(min_length=1, description="What this worker is asked to do")


def follow_up(step: type[Step], task: str) -> RunStepRequest:
    """One ``run_steps`` request for a follow-up worker: the task travels as params, the opener as a message."""
    return RunStepRequest(step, params={"task": task}, user_message=f"Carry out your assignment: {task}.")


def outcome(batch: ParallelBatchResult) -> dict[str, Any]:
    """The join of a follow-up batch as JSON: each branch's output, or the error that rejected it."""
    return {
        branch.key: {"output": branch.output}
        if branch.status == "fulfilled"
        else {"error": f"{type(branch.error).__name__}: {branch.error}"}
        for branch in batch.branches
    }


class FollowUpStep(Step):
    """A worker that confirms its task in one sentence and records the confirmation in its own state.

    It is only ever run through ``run_steps``: its task comes from the invocation's params.
    """

    def parallel_params_schema(self) -> type[BaseModel]:
        return FollowUpParams

    def task(self) -> str:
        return str(self.get_parallel_invocation().params["task"])

    def prerequisite_note(self) -> str:
        """Extra context for the prompt, appended to the assignment line (empty by default)."""
        return ""

    def get_prompt(self) -> str:
        return prompt("follow_up.md", __file__, step=self.id, task=self.task(), prerequisite=self.prerequisite_note())

    async def on_response(self, result: Any) -> str:
        confirmation = result if isinstance(result, str) else json.dumps(result)
        self.save_state({"task": self.task(), "confirmation": confirmation})
        return confirmation


class ConcurStep3(FollowUpStep):
    """A leaf worker, run by ConcurStep1 after ConcurStep1's own model call."""


class ConcurStep4(FollowUpStep):
    """A leaf worker, run by ConcurStep2 before ConcurStep2's own model call."""


class ConcurStep1(FollowUpStep):
    """Nests after its model call: the follow-up runs once this worker's own answer is known."""

    async def on_response(self, result: Any) -> str:
        confirmation = await super().on_response(result)
        batch = await self.run_steps([follow_up(ConcurStep3, "double-check what ConcurStep1 reported")])
        self.save_state({"followUp": outcome(batch)})
        return confirmation


class ConcurStep2(FollowUpStep):
    """Nests before its model call: the child's answer is an input of this worker's prompt."""

    async def on_enter(self) -> None:
        await super().on_enter()
        batch = await self.run_steps([follow_up(ConcurStep4, "prepare the ground for ConcurStep2")])
        self.save_state({"prerequisite": outcome(batch)})

    def prerequisite_note(self) -> str:
        done = self.get_state("prerequisite.ConcurStep4.output")
        if done is None:
            return " The preparatory worker failed, so mention that you went ahead without it."
        return f" The preparatory worker already reported: {done}"
