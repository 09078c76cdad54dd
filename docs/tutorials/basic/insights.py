"""InsightsStep: two parallel workers and a nested child, all inside one turn."""

from __future__ import annotations

from picoflow import LogicStep, Step, Transition, go
from picoflow.authoring.step_runs import RunStepRequest

from .favorites import FavoritesStep


# --8<-- [start:workers]
class ColorMeaningStep(Step):
    """A worker: one short sentence about the favourite colour."""

    def get_prompt(self) -> str:
        color = self.flow.get_step_state(FavoritesStep, "color")
        return f"In one sentence, say what the colour {color} is often said to stand for."


class SeasonMeaningStep(Step):
    """A worker: one short sentence about the favourite season."""

    def get_prompt(self) -> str:
        season = self.flow.get_step_state(FavoritesStep, "season")
        return f"In one sentence, say what people tend to love about {season}."
# --8<-- [end:workers]


class TaglineStep(Step):
    """A child step: turn what the workers wrote into one line for the profile."""

    def get_prompt(self) -> str:
        return "Write a six-word profile tagline from the notes the user message gives you."


class InsightsStep(LogicStep):
    """Fan out to two workers, hand their notes to a child step, pass the result on as transient state."""

    async def run_logic(self) -> Transition:
        # --8<-- [start:batch]
        batch = await self.run_steps([RunStepRequest(ColorMeaningStep), RunStepRequest(SeasonMeaningStep)])
        notes = " ".join(str(branch.output) for branch in batch.fulfilled)
        # --8<-- [end:batch]
        tagline = await self.run_step(TaglineStep, notes)
        # Transient: SummaryStep reads it in this request only; it is never written to the session.
        self.flow.save_transient_step_state("SummaryStep", {"notes": notes, "tagline": tagline})
        return go("SummaryStep")
