"""RefundFlow: verify an order, take a return and refund it by policy, then close the case."""

from __future__ import annotations

from flows.refunds.steps import ReturnsStep, TriageStep
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep


class RefundFlow(Flow):
    """A post-purchase support case: the triage hub verifies and routes, the returns desk refunds once."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini", params={"temperature": 0})

    def define_steps(self) -> list[Step]:
        # TriageStep comes first, so it is where a new case starts.
        return [
            TriageStep(self).use_memory("refunds-triage"),
            ReturnsStep(self).use_memory("refunds-returns"),
            TerminateSessionStep(self).use_memory("refunds-end"),
        ]
