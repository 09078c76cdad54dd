"""InContextStep: a nested child that answers with structured output instead of text."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flows.basic.concurrent import ConcurStep1, ConcurStep2, follow_up, outcome
from picoflow import Step
from picoflow.authoring.prompts import prompt


class MovieIdea(BaseModel):
    """The shape the model's answer must take."""

    model_config = ConfigDict(populate_by_name=True)

    title: str = Field(description="Movie title")
    genre: str = Field(description="Main genre")
    release_year: int = Field(alias="releaseYear", description="Year of release")
    rating: float = Field(ge=0, le=10, description="Rating from 0 to 10")
    summary: str = Field(description="A short plot summary")


class InContextStep(Step):
    """Run by NameStep through ``run_step``: it never becomes the current step.

    Before its own model call it fans out to ConcurStep1 and ConcurStep2 in parallel (each of which nests
    one more worker) and keeps what they returned.
    """

    async def on_enter(self) -> None:
        await super().on_enter()
        # The two branches are independent: separate step classes, separate state slots, no shared history.
        batch = await self.run_steps(
            [
                follow_up(ConcurStep1, "run the first follow-up task"),
                follow_up(ConcurStep2, "run the second follow-up task"),
            ]
        )
        # Results come back in request order, whichever branch finished first; a failed branch is
        # recorded here instead of failing the user's turn.
        self.save_state({"followUps": outcome(batch)})

    def get_prompt(self) -> str:
        # The caller passes this per-request argument as transient state; it is never persisted.
        note = self.get_transient_state("note") or "none"
        return prompt("in_context.md", __file__, note=note)

    def struct_output_schema(self) -> type[BaseModel]:
        return MovieIdea

    async def on_response(self, result: Any) -> str:
        idea = result.model_dump(by_alias=True) if isinstance(result, BaseModel) else result
        self.save_state({"movieIdea": idea})
        # The parent receives message content, so hand it text.
        return json.dumps(idea)
