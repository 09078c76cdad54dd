"""Deterministic eligibility and rating from the versioned (fictional) rules in ``quote_config.json``.

No model takes part here: the same application and date always give the same decision, reason codes,
quote id and premiums. The rules file is validated once, when this module is imported.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.home_insurance.records import (
    Construction,
    Deductible,
    DwellingType,
    Endorsement,
    Hazard,
    LiabilityLimit,
    Occupancy,
    Protection,
    QuoteApplication,
    QuoteOption,
    QuoteResult,
    RoofMaterial,
)

CONFIG_PATH = Path(__file__).with_name("quote_config.json")
QUOTE_ID_PREFIX = "HIQ"
_CENT = Decimal("0.01")
_THOUSAND = Decimal(1000)
_MONTHS = Decimal(12)


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class AgeBand(_Config):
    """A factor that applies up to ``max_years`` of age (bands are checked in order)."""

    max_years: int = Field(alias="maxYears", ge=0)
    factor: Decimal = Field(gt=0)


class LimitRange(_Config):
    """The dwelling limits the product accepts at all."""

    min: int = Field(gt=0)
    max: int = Field(gt=0)


class SystemsCredit(_Config):
    """A credit for electrical, plumbing and heating systems updated within ``within_years``."""

    within_years: int = Field(alias="withinYears", ge=0)
    factor: Decimal = Field(gt=0)


class Tier(_Config):
    """One product option: a price factor, extended dwelling cover and endorsements it includes."""

    id: str = Field(pattern=r"^[A-Z]+$")
    name: str
    factor: Decimal = Field(gt=0)
    extended_dwelling_percent: int = Field(alias="extendedDwellingPercent", ge=0)
    included_endorsements: list[Endorsement] = Field(alias="includedEndorsements")


class ReferralRules(_Config):
    """Thresholds beyond which an application goes to an underwriter instead of being priced."""

    max_roof_age_years: int = Field(alias="maxRoofAgeYears")
    max_claims_five_years: int = Field(alias="maxClaimsFiveYears")
    max_dwelling_limit: int = Field(alias="maxDwellingLimit")
    oldest_unrenovated_year_built: int = Field(alias="oldestUnrenovatedYearBuilt")
    referred_roof_materials: list[RoofMaterial] = Field(alias="referredRoofMaterials")
    referred_occupancies: list[Occupancy] = Field(alias="referredOccupancies")


class QuoteConfig(_Config):
    """The validated rules file: supported states, factors, fees, tiers and referral thresholds."""

    rules_version: str = Field(alias="rulesVersion", min_length=1)
    carrier: str
    quote_valid_days: int = Field(alias="quoteValidDays", gt=0)
    max_effective_days: int = Field(alias="maxEffectiveDays", gt=0)
    supported_states: list[str] = Field(alias="supportedStates", min_length=1)
    dwelling_limit: LimitRange = Field(alias="dwellingLimit")
    base_rate_per_thousand: Decimal = Field(alias="baseRatePerThousand", gt=0)
    minimum_annual_premium: Decimal = Field(alias="minimumAnnualPremium", ge=0)
    state_factors: dict[str, Decimal] = Field(alias="stateFactors")
    occupancy_factors: dict[Occupancy, Decimal] = Field(alias="occupancyFactors")
    dwelling_type_factors: dict[DwellingType, Decimal] = Field(alias="dwellingTypeFactors")
    construction_factors: dict[Construction, Decimal] = Field(alias="constructionFactors")
    roof_material_factors: dict[RoofMaterial, Decimal] = Field(alias="roofMaterialFactors")
    roof_age_bands: list[AgeBand] = Field(alias="roofAgeBands", min_length=1)
    home_age_bands: list[AgeBand] = Field(alias="homeAgeBands", min_length=1)
    systems_update_credit: SystemsCredit = Field(alias="systemsUpdateCredit")
    claims_factors: list[Decimal] = Field(alias="claimsFactors", min_length=1)
    hazard_surcharges: dict[Hazard, Decimal] = Field(alias="hazardSurcharges")
    protection_credits: dict[Protection, Decimal] = Field(alias="protectionCredits")
    max_protection_credit: Decimal = Field(alias="maxProtectionCredit", ge=0, lt=1)
    deductible_factors: dict[int, Decimal] = Field(alias="deductibleFactors")
    liability_charges: dict[int, Decimal] = Field(alias="liabilityCharges")
    endorsement_fees: dict[Endorsement, Decimal] = Field(alias="endorsementFees")
    tiers: list[Tier] = Field(min_length=1)
    referral: ReferralRules
    reason_descriptions: dict[str, str] = Field(alias="reasonDescriptions")

    @model_validator(mode="after")
    def _complete(self) -> QuoteConfig:
        # Every supported value must have a factor: a gap would surface as a KeyError mid-quote.
        missing = [state for state in self.supported_states if state not in self.state_factors]
        if missing:
            raise ValueError(f"stateFactors lacks {missing}")
        for name, table, literal in (
            ("occupancyFactors", self.occupancy_factors, Occupancy),
            ("dwellingTypeFactors", self.dwelling_type_factors, DwellingType),
            ("constructionFactors", self.construction_factors, Construction),
            ("roofMaterialFactors", self.roof_material_factors, RoofMaterial),
            ("hazardSurcharges", self.hazard_surcharges, Hazard),
            ("protectionCredits", self.protection_credits, Protection),
            ("deductibleFactors", self.deductible_factors, Deductible),
            ("liabilityCharges", self.liability_charges, LiabilityLimit),
            ("endorsementFees", self.endorsement_fees, Endorsement),
        ):
            absent = set(get_args(literal)) - set(table)
            if absent:
                raise ValueError(f"{name} lacks {sorted(absent, key=str)}")
        for name, bands in (("roofAgeBands", self.roof_age_bands), ("homeAgeBands", self.home_age_bands)):
            limits = [band.max_years for band in bands]
            if limits != sorted(set(limits)):
                raise ValueError(f"{name} must be in strictly increasing order of maxYears")
        if self.roof_age_bands[-1].max_years < self.referral.max_roof_age_years:
            raise ValueError("roofAgeBands must cover every roof age below the referral threshold")
        if len(self.claims_factors) <= self.referral.max_claims_five_years:
            raise ValueError("claimsFactors must cover every claim count below the referral threshold")
        if len({tier.id for tier in self.tiers}) != len(self.tiers):
            raise ValueError("tier ids must be unique")
        return self


def load_quote_config(path: Path = CONFIG_PATH) -> QuoteConfig:
    """Read and validate a rules file."""
    return QuoteConfig.model_validate_json(path.read_text(encoding="utf-8"))


QUOTE_CONFIG = load_quote_config()


def money(value: Decimal) -> Decimal:
    """Round to the cent, halves away from zero: the one rounding rule for every amount."""
    return value.quantize(_CENT, rounding=ROUND_HALF_UP)


def quote_id(application: QuoteApplication, current_date: date) -> str:
    """An id derived from the whole application and the rating date, so any input change gives a new id."""
    canonical = json.dumps(application.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8].upper()
    return f"{QUOTE_ID_PREFIX}-{current_date:%Y%m%d}-{digest}"


def referral_reasons(
    application: QuoteApplication, current_date: date, config: QuoteConfig = QUOTE_CONFIG
) -> list[str]:
    """The reason codes that send an application to an underwriter, in a fixed order; empty when none."""
    rules = config.referral
    qualification, home, risk, coverage = (
        application.qualification,
        application.property,
        application.risk,
        application.coverage,
    )
    reasons: list[str] = []
    if qualification.occupancy in rules.referred_occupancies:
        reasons.append("RENTAL_OCCUPANCY")
    if home.roof_age_years > rules.max_roof_age_years:
        reasons.append("ROOF_AGE")
    if home.roof_material in rules.referred_roof_materials:
        reasons.append("ROOF_MATERIAL")
    renovated = _systems_recent(home.systems_updated_year, current_date, config)
    if home.year_built < rules.oldest_unrenovated_year_built and not renovated:
        reasons.append("DWELLING_AGE")
    if risk.claims_last_five_years > rules.max_claims_five_years:
        reasons.append("CLAIMS_FREQUENCY")
    if coverage.dwelling_limit > rules.max_dwelling_limit:
        reasons.append("HIGH_DWELLING_LIMIT")
    return reasons


def rate_application(
    application: QuoteApplication, current_date: date, config: QuoteConfig = QUOTE_CONFIG
) -> QuoteResult:
    """Decide and price ``application`` as of ``current_date``.

    An unsupported state gives ``unsupported`` with no premiums; any referral reason gives ``referral``
    with its codes and no premiums; otherwise ``eligible`` with one option per configured tier.
    """
    version, today = config.rules_version, current_date
    if application.qualification.state not in config.supported_states:
        return QuoteResult(
            decision="unsupported", reason_codes=["UNSUPPORTED_STATE"], rules_version=version, quoted_on=today
        )
    reasons = referral_reasons(application, current_date, config)
    if reasons:
        return QuoteResult(decision="referral", reason_codes=reasons, rules_version=version, quoted_on=today)

    core = _core_premium(application, current_date, config)
    coverage = application.coverage
    options = []
    for tier in config.tiers:
        endorsements: list[str] = sorted(set(coverage.endorsements) | set(tier.included_endorsements))
        # Endorsements a tier includes are part of its factor, so only the others are charged.
        fees = sum(
            (config.endorsement_fees[name] for name in coverage.endorsements if name not in tier.included_endorsements),
            Decimal(0),
        )
        annual = money(core * tier.factor + config.liability_charges[coverage.liability_limit] + fees)
        annual = max(annual, config.minimum_annual_premium)
        options.append(
            QuoteOption(
                id=tier.id,
                name=tier.name,
                annual_premium=annual,
                monthly_estimate=money(annual / _MONTHS),
                dwelling_limit=coverage.dwelling_limit,
                extended_dwelling_limit=coverage.dwelling_limit * tier.extended_dwelling_percent // 100,
                deductible=coverage.deductible,
                liability_limit=coverage.liability_limit,
                endorsements=endorsements,
            )
        )
    return QuoteResult(
        decision="eligible",
        quote_id=quote_id(application, current_date),
        valid_through=current_date + timedelta(days=config.quote_valid_days),
        options=options,
        rules_version=version,
        quoted_on=today,
    )


def _core_premium(application: QuoteApplication, current_date: date, config: QuoteConfig) -> Decimal:
    qualification, home, risk, coverage = (
        application.qualification,
        application.property,
        application.risk,
        application.coverage,
    )
    factor = (
        config.state_factors[qualification.state]
        * config.occupancy_factors[qualification.occupancy]
        * config.dwelling_type_factors[home.dwelling_type]
        * config.construction_factors[home.construction]
        * config.roof_material_factors[home.roof_material]
        * _band_factor(config.roof_age_bands, home.roof_age_years)
        * _band_factor(config.home_age_bands, max(current_date.year - home.year_built, 0))
        * config.claims_factors[risk.claims_last_five_years]
        * config.deductible_factors[coverage.deductible]
    )
    if _systems_recent(home.systems_updated_year, current_date, config):
        factor *= config.systems_update_credit.factor
    surcharge = sum((config.hazard_surcharges[name] for name in risk.hazards), Decimal(0))
    credit = min(
        sum((config.protection_credits[name] for name in risk.protections), Decimal(0)),
        config.max_protection_credit,
    )
    base = Decimal(coverage.dwelling_limit) / _THOUSAND * config.base_rate_per_thousand
    return base * factor * (1 + surcharge) * (1 - credit)


def _band_factor(bands: list[AgeBand], years: int) -> Decimal:
    for band in bands:
        if years <= band.max_years:
            return band.factor
    # Referral rules stop older roofs before rating; an older home takes the last band.
    return bands[-1].factor


def _systems_recent(updated_year: int | None, current_date: date, config: QuoteConfig) -> bool:
    return updated_year is not None and current_date.year - updated_year <= config.systems_update_credit.within_years
