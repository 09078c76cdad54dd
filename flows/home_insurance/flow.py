"""HomeInsuranceQuoteFlow: a preliminary home insurance quote with code-owned eligibility and pricing."""

from __future__ import annotations

from typing import Any

from flows.home_insurance.steps import (
    ContactStep,
    CoverageStep,
    PresentQuoteStep,
    PropertyStep,
    QualificationStep,
    RateQuoteStep,
    ReferralStep,
    ReviewStep,
    RiskStep,
)
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.stores import SessionDoc

#: The three interview steps share this history, since a correction often spans them.
INTAKE_MEMORY = "home-quote-intake"
#: A session left alone this long starts over instead of resuming old answers or a stale quote.
SESSION_IDLE_MS = 30 * 60_000


class HomeInsuranceQuoteFlow(Flow):
    """A preliminary home insurance quote in ten registered steps.

    Interview (qualification, property, risk, coverage), a review gate, deterministic rating, exact
    quote tables with re-rating, and consent-gated contact details for an agent's follow-up.
    """

    def __init__(self) -> None:
        super().__init__()
        # Only the long intake interview is worth summarising; the other namespaces stay short.
        self.get_memory().set_summary_model(
            ModelSelection(provider="openai", name="gpt-4o", retry_attempts=3)
        ).set_summary_config(min_messages=12, recent_messages=6).enable_summary(INTAKE_MEMORY)

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o", retry_attempts=3)

    def config_llm_call_policy(self) -> dict[str, Any]:
        return {"timeout_ms": 120_000}

    def define_steps(self) -> list[Step]:
        return [
            QualificationStep(self).use_memory(INTAKE_MEMORY),
            PropertyStep(self).use_memory(INTAKE_MEMORY),
            RiskStep(self).use_memory(INTAKE_MEMORY),
            CoverageStep(self).use_memory("home-quote-coverage"),
            ReviewStep(self).use_memory("home-quote-review"),
            # A logic step: no model reads its history, so it keeps the default namespace.
            RateQuoteStep(self),
            PresentQuoteStep(self).use_memory("home-quote-options"),
            ContactStep(self).use_memory("home-quote-contact"),
            ReferralStep(self).use_memory("home-quote-referral"),
            TerminateSessionStep(self).use_memory("home-quote-terminal"),
        ]

    def initial_step(self) -> type[Step]:
        return QualificationStep

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        restored = await super().on_restore_session_doc(doc)
        if restored is None:
            return None
        return None if self.session_idle_ms(restored) >= SESSION_IDLE_MS else restored
