"""InContextStep: a nested child that answers with structured output instead of text."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from picoflow import Step
from picoflow.prompts import prompt


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

    The original demo also fans out to parallel children from ``on_enter``; that part waits for
    ``run_steps``.
    """

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
