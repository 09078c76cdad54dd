"""HomeInsuranceQuoteFlow: a preliminary home insurance quote.

The model interviews and explains; code owns eligibility, reason codes, quote ids, premiums, option
validation and re-rating. ``conversation.json`` is a scripted session for the offline demo and tests.
"""

from __future__ import annotations

from flows.home_insurance.flow import INTAKE_MEMORY, SESSION_IDLE_MS, HomeInsuranceQuoteFlow

__all__ = ["INTAKE_MEMORY", "SESSION_IDLE_MS", "HomeInsuranceQuoteFlow"]
