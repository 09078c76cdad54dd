"""SupportFlow: Northwind Outfitters' post-purchase support, from order verification to a closed case."""

from __future__ import annotations

from flows.support.steps import (
    AdjudicateStep,
    ApprovalStep,
    BillingStep,
    DecidedApprovalStep,
    EscalateStep,
    ReturnsStep,
    TriageStep,
)
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.stores import SessionDoc

#: A case left alone this long starts over.
SESSION_IDLE_MS = 30 * 60_000
#: A refund waiting for the customer's decision this long is released: the case goes back to the front desk.
APPROVAL_HOLD_MS = 10 * 60_000


class SupportFlow(Flow):
    """Triage, Returns, Adjudicate, Approval, Billing, Escalate and Terminate steps over six demo orders."""

    def __init__(self) -> None:
        super().__init__()
        # The front desk sees the whole case; its history is the one that grows.
        self.get_memory().set_summary_model(
            ModelSelection(provider="openai", name="gpt-4o", retry_attempts=3)
        ).set_summary_config(min_messages=8, recent_messages=4).enable_summary("support-triage")

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o", retry_attempts=3)

    def define_steps(self) -> list[Step]:
        # As the original, the model commits a refund on the customer's clear yes; with config approvals: true the
        # customer decides it through the framework's approval instead (docs/how-to/approvals.md).
        approval = DecidedApprovalStep(self) if self.get_context("config.approvals") is True else ApprovalStep(self)
        return [
            TriageStep(self).use_memory("support-triage"),
            ReturnsStep(self).use_memory("support-returns"),
            AdjudicateStep(self),
            approval.use_memory("support-approval"),
            BillingStep(self).use_memory("support-billing"),
            EscalateStep(self),
            TerminateSessionStep(self).use_memory("support-terminal"),
        ]

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        restored = await super().on_restore_session_doc(doc)
        if restored is None:
            return None
        idle = self.session_idle_ms(restored)
        if idle >= SESSION_IDLE_MS:
            return None
        if restored.flow.current_step != ApprovalStep.id or idle < APPROVAL_HOLD_MS:
            return restored
        # The hold expired: the refund is dropped uncommitted and the customer is back at the front desk.
        for step in restored.flow.steps:
            if step.name == ApprovalStep.id:
                step.state = {key: value for key, value in step.state.items() if key != "pending"}
        restored.flow.current_step = TriageStep.id
        return restored
