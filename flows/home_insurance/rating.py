"""Evergreen Home Insurance's demo rating rules, as code: an application in, a decision and priced options out.

``quote(application, current_date)`` takes a quote application as JSON (the camelCase records the flow's
steps save: ``qualification``, ``property``, ``risk``, ``coverage``) and returns the quote result as JSON
(``decision``, ``reasonCodes``, ``quoteId``, ``rulesVersion``, ``generatedAt``, ``validThrough``, ``options``).
No model takes part: the same application and instant always give the same result, quote id included.

Amounts are binary floating point computed in a fixed order and rounded to the cent half up, and the quote
id hashes the application's JavaScript-style JSON text, so results agree to the cent and the id with the
TypeScript demo this flow comes from. The rules (factors, tiers, referral thresholds) are in
``quote_config.json``, validated once when this module is imported.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flows.home_insurance.jsontext import js_stringify
from flows.home_insurance.records import Endorsement

CONFIG_PATH = Path(__file__).with_name("quote_config.json")
QUOTE_ID_PREFIX = "EHI"
#: The reason code of a state without online quotes; it makes the decision ``unsupported``.
UNSUPPORTED_STATE = "UNSUPPORTED_STATE"
#: Years of claims history that count towards the referral rules.
CLAIMS_WINDOW_YEARS = 5
#: The smallest step above 1.0 of a double, added before rounding so 1.005-style amounts round up.
_EPSILON = 2.220446049250313e-16


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Band(_Config):
    """A factor for ages up to ``maxYears``; bands are read in order and the last one covers any older age."""

    maxYears: float = Field(ge=0)  # noqa: N815 - the rules file's own key
    factor: float = Field(gt=0)


class HazardFactors(_Config):
    """Multipliers for each hazard on the premises."""

    pool: float = Field(gt=0)
    trampoline: float = Field(gt=0)
    woodStove: float = Field(gt=0)  # noqa: N815


class ProtectionDiscounts(_Config):
    """Shares taken off the premium for each protective device."""

    monitoredAlarm: float = Field(ge=0, le=0.5)  # noqa: N815
    sprinklerSystem: float = Field(ge=0, le=0.5)  # noqa: N815


class ReferralRules(_Config):
    """Thresholds beyond which an application goes to an agent instead of being priced."""

    maxDwellingCoverage: float = Field(gt=0)  # noqa: N815
    maxRoofAgeYears: float = Field(ge=0)  # noqa: N815
    maxClaimsInFiveYears: int = Field(ge=0)  # noqa: N815
    maxSingleClaimAmount: float = Field(ge=0)  # noqa: N815
    minimumYearBuilt: int  # noqa: N815


class Tier(_Config):
    """One option of an eligible quote: a premium factor, a dwelling extension, a liability floor, endorsements."""

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    premiumFactor: float = Field(gt=0)  # noqa: N815
    dwellingExtensionPercent: float = Field(ge=0, le=100)  # noqa: N815
    minimumLiability: float = Field(gt=0)  # noqa: N815
    includedEndorsements: list[Endorsement]  # noqa: N815


class QuoteConfig(_Config):
    """The rules file, its keys as written there."""

    carrierName: str = Field(min_length=1)  # noqa: N815
    rulesVersion: str = Field(min_length=1)  # noqa: N815
    supportedStates: list[str] = Field(min_length=1)  # noqa: N815
    quoteValidDays: int = Field(gt=0)  # noqa: N815
    baseRatePerThousand: float = Field(gt=0)  # noqa: N815
    deductibleFactors: dict[str, float]  # noqa: N815
    constructionFactors: dict[str, float]  # noqa: N815
    occupancyFactors: dict[str, float]  # noqa: N815
    homeAgeBands: list[Band] = Field(min_length=1)  # noqa: N815
    roofAgeBands: list[Band] = Field(min_length=1)  # noqa: N815
    claimFactors: dict[str, float]  # noqa: N815
    hazardFactors: HazardFactors  # noqa: N815
    protectionDiscounts: ProtectionDiscounts  # noqa: N815
    endorsementAnnualFees: dict[Endorsement, float]  # noqa: N815
    referralRules: ReferralRules  # noqa: N815
    tiers: list[Tier] = Field(min_length=1)


def load_quote_config(path: Path = CONFIG_PATH) -> QuoteConfig:
    """Read and validate a rules file."""
    return QuoteConfig.model_validate_json(path.read_text(encoding="utf-8"))


QUOTE_CONFIG = load_quote_config()


def quote(application: dict[str, Any], current_date: datetime, config: QuoteConfig = QUOTE_CONFIG) -> dict[str, Any]:
    """Decide and price ``application`` at ``current_date`` (a naive datetime is taken as UTC).

    An unsupported state gives ``unsupported``, any referral reason ``referral`` (both without options),
    otherwise ``eligible`` with one option per tier. Raises ``ValueError`` when the rules lack a factor for
    a value of the application.
    """
    now = current_date.replace(tzinfo=UTC) if current_date.tzinfo is None else current_date.astimezone(UTC)
    reasons = review_reasons(application, now, config)
    decision = "unsupported" if UNSUPPORTED_STATE in reasons else "referral" if reasons else "eligible"
    return {
        "decision": decision,
        "reasonCodes": reasons,
        "quoteId": quote_id(application, now),
        "rulesVersion": config.rulesVersion,
        "generatedAt": iso_instant(now),
        "validThrough": (now + timedelta(days=config.quoteValidDays)).date().isoformat(),
        "options": price_options(application, now, config) if decision == "eligible" else [],
    }


def review_reasons(application: dict[str, Any], now: datetime, config: QuoteConfig = QUOTE_CONFIG) -> list[str]:
    """The reason codes that keep ``application`` from an online quote, each once, in the rules' order."""
    rules = config.referralRules
    home, coverage = application["property"], application["coverage"]
    checks = [
        (UNSUPPORTED_STATE, application["qualification"]["state"] not in config.supportedStates),
        ("HIGH_DWELLING_LIMIT", coverage["dwellingCoverage"] > rules.maxDwellingCoverage),
        ("ROOF_AGE_REVIEW", home["roofAgeYears"] > rules.maxRoofAgeYears),
        ("HISTORIC_HOME_REVIEW", home["yearBuilt"] < rules.minimumYearBuilt),
    ]
    recent = [claim for claim in application["risk"]["claims"] if claim["year"] >= now.year - CLAIMS_WINDOW_YEARS]
    checks += [
        ("CLAIMS_FREQUENCY_REVIEW", len(recent) > rules.maxClaimsInFiveYears),
        ("LARGE_CLAIM_REVIEW", any(claim["amount"] > rules.maxSingleClaimAmount for claim in recent)),
    ]
    return [code for code, applies in checks if applies]


def price_options(
    application: dict[str, Any], now: datetime, config: QuoteConfig = QUOTE_CONFIG
) -> list[dict[str, Any]]:
    """One priced option per tier, in the tiers' order."""
    qualification, home = application["qualification"], application["property"]
    risk, coverage = application["risk"], application["coverage"]
    factors = [
        _band(max(0, now.year - home["yearBuilt"]), config.homeAgeBands),
        _band(home["roofAgeYears"], config.roofAgeBands),
        config.constructionFactors.get(home["construction"]),
        config.occupancyFactors.get(qualification["occupancy"]),
        config.deductibleFactors.get(js_stringify(coverage["deductible"])),
        # Every claim on record counts here, however old; two or more share the top factor.
        config.claimFactors.get(str(min(len(risk["claims"]), 2))),
    ]
    if any(not factor for factor in factors[2:]):
        raise ValueError("Quote configuration is missing an application factor.")
    hazard = 1.0
    for name, surcharge in (
        ("pool", config.hazardFactors.pool),
        ("trampoline", config.hazardFactors.trampoline),
        ("woodStove", config.hazardFactors.woodStove),
    ):
        if risk["hazards"][name]:
            hazard *= surcharge
    protection = 1.0
    for name, discount in (
        ("monitoredAlarm", config.protectionDiscounts.monitoredAlarm),
        ("sprinklerSystem", config.protectionDiscounts.sprinklerSystem),
    ):
        if risk["protections"][name]:
            protection -= discount
    # Multiplied one factor at a time, left to right: float products depend on their order.
    annual_base = coverage["dwellingCoverage"] / 1000 * config.baseRatePerThousand
    for factor in [*factors, hazard, protection]:
        annual_base *= float(factor or 0)
    options = []
    for tier in config.tiers:
        endorsements = list(dict.fromkeys([*coverage["endorsements"], *tier.includedEndorsements]))
        fees: float = 0
        for endorsement in endorsements:
            fees += config.endorsementAnnualFees[endorsement]
        annual = money(annual_base * tier.premiumFactor + fees)
        options.append({
            "id": tier.id,
            "name": tier.name,
            "annualPremium": annual,
            "monthlyPremium": money(annual / 12),
            "dwellingCoverage": coverage["dwellingCoverage"],
            "dwellingExtensionPercent": _plain(tier.dwellingExtensionPercent),
            "deductible": coverage["deductible"],
            "liabilityLimit": max(coverage["liabilityLimit"], _plain(tier.minimumLiability)),
            "endorsements": endorsements,
        })
    return options


def money(value: float) -> float:
    """``value`` to the cent, halves rounded up, after a nudge of one epsilon (so 1.005 becomes 1.01)."""
    cents = (value + _EPSILON) * 100
    whole = math.floor(cents)
    return (whole + 1 if cents - whole >= 0.5 else whole) / 100


def quote_id(application: dict[str, Any], now: datetime) -> str:
    """``EHI-<date>-<8 hex>``: the digest of the application's JSON text, so any change gives a new id."""
    digest = hashlib.sha256(js_stringify(application).encode("utf-8")).hexdigest()[:8].upper()
    return f"{QUOTE_ID_PREFIX}-{now.astimezone(UTC):%Y%m%d}-{digest}"


def iso_instant(moment: datetime) -> str:
    """A UTC instant with milliseconds and a ``Z``, e.g. ``2027-07-15T00:00:00.000Z``."""
    utc = moment.astimezone(UTC)
    return f"{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond // 1000:03d}Z"


def _band(value: float, bands: list[Band]) -> float:
    return next((band.factor for band in bands if value <= band.maxYears), bands[-1].factor)


def _plain(value: float) -> float | int:
    # Whole numbers from the rules file stay integers in the result, as they are in its JSON.
    return int(value) if value.is_integer() else value
