"""OrderHelpFlow: the support tutorial's flow. A verified customer asks to return items; code decides."""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.stores import SessionDoc

from .steps import AdjudicateStep, ReturnsStep, TriageStep

# --8<-- [start:flow]
MODEL = ModelSelection(provider="openai", name="gpt-4o-mini")
IDLE_LIMIT_MS = 30 * 60 * 1000


class OrderHelpFlow(Flow):
    """Triage (verify the order), the returns desk, and the policy decision."""

    def __init__(self) -> None:
        super().__init__()
        # Triage can run long while a customer hunts for an order number: keep its history short.
        self.get_memory().set_summary_model(MODEL).set_summary_config(min_messages=8, recent_messages=4).enable_summary(
            "triage"
        )

    def config_model(self) -> ModelSelection:
        return MODEL

    def define_steps(self) -> list[Step]:
        return [
            TriageStep(self).use_memory("triage"),
            ReturnsStep(self).use_memory("returns"),
            AdjudicateStep(self).use_memory("returns"),
            TerminateSessionStep(self).use_memory("end"),
        ]

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        # A case left idle for half an hour starts again, with a fresh verification.
        if self.session_idle_ms(doc) > IDLE_LIMIT_MS:
            return None
        return await super().on_restore_session_doc(doc)
# --8<-- [end:flow]


__all__ = ["OrderHelpFlow"]
