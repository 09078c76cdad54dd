"""HotelFlow: book a Portland hotel in four stages (explore, present, compare, book)."""

from __future__ import annotations

from flows.hotel.steps import CompareStep, ExploreStep, PresentStep
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep

MODEL = ModelSelection(provider="openai", name="gpt-4o")


class HotelFlow(Flow):
    """Collect criteria, present priced results, compare them, and book one."""

    def __init__(self) -> None:
        super().__init__()
        # Criteria collection runs for many short turns: fold its older history into a rolling summary.
        self.get_memory().set_summary_model(MODEL).set_summary_config(min_messages=8, recent_messages=4).enable_summary(
            "hotel-explore"
        )

    def config_model(self) -> ModelSelection:
        return MODEL

    def define_steps(self) -> list[Step]:
        # ExploreStep comes first, so it is where a new session starts.
        return [
            ExploreStep(self).use_memory("hotel-explore"),
            PresentStep(self),
            CompareStep(self),
            TerminateSessionStep(self).use_memory("end"),
        ]
