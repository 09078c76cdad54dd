"""Typed records of a home quote: the four application parts, the quote result and contact details.

Each application part is owned by one step and doubles as the argument schema of the tool that
captures it, so the model's arguments and the persisted state are validated by the same model.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

Occupancy = Literal["primary", "secondary", "rental"]
DwellingType = Literal["single_family", "townhouse", "duplex"]
Construction = Literal["frame", "masonry", "fire_resistive"]
RoofMaterial = Literal["asphalt_shingle", "metal", "tile", "slate", "wood_shake"]
Hazard = Literal["swimming_pool", "trampoline", "wood_stove", "space_heater"]
Protection = Literal["monitored_alarm", "smoke_detectors", "sprinklers", "deadbolts", "water_leak_sensors"]
Endorsement = Literal["water_backup", "equipment_breakdown", "identity_recovery", "service_line"]
Deductible = Literal[1000, 2500, 5000]
LiabilityLimit = Literal[100000, 300000, 500000]
Decision = Literal["eligible", "referral", "unsupported"]
CorrectionSection = Literal["qualification", "property", "risk", "coverage"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _canonical(values: list[str]) -> list[str]:
    # Sorted and de-duplicated, so equal applications serialise (and hash) identically.
    return sorted(set(values))


class Qualification(_Record):
    """Where the home is, how it is occupied and when cover should start (owned by QualificationStep)."""

    state: Annotated[str, StringConstraints(strip_whitespace=True, to_upper=True, pattern=r"^[A-Z]{2}$")] = Field(
        description="Two-letter US state code of the property, e.g. OH"
    )
    zip_code: Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^\d{5}$")] = Field(
        description="Five-digit ZIP code of the property"
    )
    purchase_status: Literal["owned", "purchasing"] = Field(
        description="'owned' when the customer already owns the home, 'purchasing' when buying it"
    )
    occupancy: Occupancy = Field(
        description="'primary' residence, 'secondary' (second or seasonal) home, or 'rental' (rented to tenants)"
    )
    effective_date: date = Field(description="Requested start of cover, YYYY-MM-DD")


class PropertyProfile(_Record):
    """The building, its roof and its systems (owned by PropertyStep)."""

    dwelling_type: DwellingType = Field(description="Kind of building")
    year_built: int = Field(ge=1800, description="Four-digit year the home was built")
    square_feet: int = Field(ge=400, le=15000, description="Finished living area in square feet")
    construction: Construction = Field(description="Wall construction: frame, masonry or fire_resistive")
    roof_material: RoofMaterial = Field(description="Main roof covering")
    roof_age_years: int = Field(ge=0, le=100, description="Age of the roof covering in whole years")
    systems_updated_year: int | None = Field(
        default=None,
        description="Year the electrical, plumbing and heating systems were last updated; null if unknown",
    )


class RiskProfile(_Record):
    """Claims history, hazards and protective devices (owned by RiskStep)."""

    claims_last_five_years: int = Field(ge=0, le=20, description="Number of property claims in the last five years")
    hazards: list[Hazard] = Field(default_factory=list, description="Liability or fire hazards on the premises")
    protections: list[Protection] = Field(default_factory=list, description="Protective devices installed")

    @field_validator("hazards", "protections")
    @classmethod
    def _sorted(cls, values: list[str]) -> list[str]:
        return _canonical(values)


class CoveragePreferences(_Record):
    """Limits, deductible and optional endorsements (owned by CoverageStep)."""

    dwelling_limit: int = Field(gt=0, description="Dwelling coverage limit in whole US dollars")
    deductible: Deductible = Field(description="All-perils deductible in US dollars: 1000, 2500 or 5000")
    liability_limit: LiabilityLimit = Field(description="Personal liability limit: 100000, 300000 or 500000")
    endorsements: list[Endorsement] = Field(default_factory=list, description="Optional endorsements requested")

    @field_validator("endorsements")
    @classmethod
    def _sorted(cls, values: list[str]) -> list[str]:
        return _canonical(values)


class QuoteApplication(_Record):
    """The four authoritative input records that a quote is calculated from."""

    qualification: Qualification
    property: PropertyProfile
    risk: RiskProfile
    coverage: CoveragePreferences


class QuoteOption(_Record):
    """One priced option of an eligible quote; amounts are exact to the cent."""

    id: str
    name: str
    annual_premium: Decimal
    monthly_estimate: Decimal
    dwelling_limit: int
    extended_dwelling_limit: int
    deductible: int
    liability_limit: int
    endorsements: list[str]


class QuoteResult(_Record):
    """The code-owned outcome of rating: a quote with options, a referral, or an unsupported location."""

    decision: Decision
    rules_version: str
    quoted_on: date
    quote_id: str | None = None
    valid_through: date | None = None
    reason_codes: list[str] = Field(default_factory=list)
    options: list[QuoteOption] = Field(default_factory=list)

    def option(self, option_id: str) -> QuoteOption | None:
        """The option with ``option_id`` (case and surrounding spaces ignored), if the quote has it."""
        wanted = option_id.strip().upper()
        return next((option for option in self.options if option.id == wanted), None)

    def option_ids(self) -> list[str]:
        """The ids of the current options, in presentation order."""
        return [option.id for option in self.options]


# -- tool arguments that are not application records ----------------------------------------------


class NoArguments(BaseModel):
    """Arguments of a tool that takes none."""


class CorrectionArgs(BaseModel):
    """Send a correction to the step that owns the corrected fact."""

    section: CorrectionSection = Field(
        description="Which part of the application changes: qualification (location, occupancy, start date), "
        "property (building, roof, systems), risk (claims, hazards, protections) or coverage (limits, "
        "deductible, endorsements)"
    )
    change: str = Field(min_length=1, description="The requested change in the customer's own words")


class CompareArgs(BaseModel):
    """Option ids to compare side by side."""

    option_ids: list[str] = Field(min_length=2, description="Two or more option ids from the current quote")


class SelectArgs(BaseModel):
    """The option the customer chooses."""

    option_id: str = Field(min_length=1, description="An option id from the current quote, e.g. ENHANCED")


class DeductibleArgs(BaseModel):
    """A new deductible for re-rating the current quote."""

    deductible: Deductible = Field(description="The new deductible in US dollars: 1000, 2500 or 5000")


class ContactArgs(BaseModel):
    """The customer's contact consent and, only with consent, how to reach them."""

    consent: bool = Field(description="True only if the customer explicitly agreed to be contacted about the quote")
    full_name: str | None = Field(default=None, description="Full name, required with consent")
    email: str | None = Field(
        default=None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="Email address, required with consent"
    )
    phone: str | None = Field(default=None, description="Optional phone number")
    street_address: str | None = Field(default=None, description="Optional street address of the property")
