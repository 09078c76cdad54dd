"""ProfileFlow: the basic tutorial's flow, collecting a small member profile one step at a time.

Path: NameStep -> BirthdayStep -> AgeGateStep (code) -> FavoritesStep -> ContactStep -> InsightsStep (code,
running two parallel workers and a nested child) -> SummaryStep -> TerminateSessionStep. Returning members
(``config.returning``) start at FavoritesStep.
"""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.stores import SessionDoc

from .age_gate import AgeGateStep
from .birthday import BirthdayStep
from .contact import ContactStep
from .favorites import FavoritesStep
from .insights import ColorMeaningStep, InsightsStep, SeasonMeaningStep, TaglineStep
from .name import NameStep
from .summary import SummaryStep

# A session idle for longer than this starts over instead of resuming half a profile.
IDLE_LIMIT_MS = 30 * 60 * 1000


class ProfileFlow(Flow):
    """Name, date of birth, favourites and contact details, then a summary."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini", params={"temperature": 0.2})

    def define_steps(self) -> list[Step]:
        return [
            NameStep(self).use_memory("profile"),
            BirthdayStep(self).use_memory("profile"),
            AgeGateStep(self).use_memory("profile"),
            # Its own namespace and a larger model: the structured answers are the hard part.
            FavoritesStep(self).use_memory("favorites").use_model(ModelSelection(provider="openai", name="gpt-4o")),
            ContactStep(self).use_memory("profile"),
            InsightsStep(self),
            # No use_memory(): each worker and the child talk in a namespace of their own (their class name).
            ColorMeaningStep(self),
            SeasonMeaningStep(self),
            TaglineStep(self),
            SummaryStep(self).use_memory("profile"),
            TerminateSessionStep(self).use_memory("end"),
        ]

    def initial_step(self) -> type[Step]:
        # Returning members have a name and a birthday on file: start at the favourites.
        return FavoritesStep if self.get_context("config.returning") else NameStep

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        if self.session_idle_ms(doc) > IDLE_LIMIT_MS:
            return None  # a new session instead
        return await super().on_restore_session_doc(doc)


__all__ = ["ProfileFlow"]
