"""Typed records of a home quote: the four application parts, the contact request and the tools' arguments.

Each application part is owned by one step and doubles as the argument schema of the tool that captures
it, so the model's arguments and the saved state are validated by the same model. Field names are the
JSON keys the records are saved and rated under (``flows.home_insurance.rating.quote`` reads them).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Occupancy = Literal["primary", "secondary", "rental"]
Endorsement = Literal["water_backup", "identity_theft", "equipment_breakdown"]
Deductible = Literal[1000, 2500, 5000]
CorrectionSection = Literal["qualification", "property", "risk", "coverage"]
Year = Annotated[int, Field(ge=1800, le=2100)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Qualification(_Record):
    """Where the home is, how it is bought and used, and when cover should start (owned by QualificationStep)."""

    state: Annotated[str, StringConstraints(min_length=2, max_length=2, to_upper=True)] = Field(
        description="Two-letter US state code of the property, e.g. OR"
    )
    zip: str = Field(pattern=r"^\d{5}$", description="Five-digit ZIP code of the property")
    purchaseStatus: Literal["own", "buying", "refinancing"] = Field(  # noqa: N815
        description="'own' when the customer owns the home, 'buying' when purchasing it, 'refinancing'"
    )
    occupancy: Occupancy = Field(description="'primary' residence, 'secondary' (seasonal) home or 'rental'")
    effectiveDate: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="Requested start of cover, YYYY-MM-DD")  # noqa: N815


class PropertyProfile(_Record):
    """The building, its roof and the years its systems were updated (owned by PropertyStep)."""

    dwellingType: Literal["single_family", "townhome", "duplex"]  # noqa: N815
    yearBuilt: Year = Field(description="Four-digit year the home was built")  # noqa: N815
    squareFeet: int = Field(ge=400, le=15000, description="Finished living area in square feet")  # noqa: N815
    stories: int | float = Field(ge=1, le=4, description="Number of stories")
    construction: Literal["wood_frame", "masonry", "mixed"]
    roofMaterial: Literal["composition", "metal", "tile"]  # noqa: N815
    roofAgeYears: int = Field(ge=0, le=75, description="Age of the roof covering in whole years")  # noqa: N815
    plumbingUpdatedYear: Year | None = Field(description="Year plumbing was last updated; null if never or unknown")  # noqa: N815
    electricalUpdatedYear: Year | None = Field(description="Year electrical was last updated; null if unknown")  # noqa: N815
    hvacUpdatedYear: Year | None = Field(description="Year heating and cooling were last updated; null if unknown")  # noqa: N815


class Claim(_Record):
    """One home insurance claim."""

    year: int = Field(ge=2000, le=2100)
    type: Literal["water", "fire", "wind", "theft", "liability", "other"]
    amount: int | float = Field(ge=0, le=10_000_000, description="Amount paid in US dollars")


class Hazards(_Record):
    """Hazards on the premises."""

    pool: bool
    trampoline: bool
    woodStove: bool  # noqa: N815


class Protections(_Record):
    """Protective devices installed."""

    smokeAlarms: bool  # noqa: N815
    burglarAlarm: bool  # noqa: N815
    monitoredAlarm: bool = Field(description="True when an alarm is professionally monitored")  # noqa: N815
    sprinklerSystem: bool  # noqa: N815


class RiskProfile(_Record):
    """Claims history, hazards and protective devices (owned by RiskStep)."""

    claims: list[Claim] = Field(max_length=10, description="Every home insurance claim, empty when none")
    hazards: Hazards
    protections: Protections


class CoveragePreferences(_Record):
    """Dwelling coverage, deductible, liability limit and endorsements (owned by CoverageStep)."""

    dwellingCoverage: int = Field(ge=100_000, le=2_000_000, description="Estimated cost to rebuild, US dollars")  # noqa: N815
    deductible: Deductible = Field(description="Deductible in US dollars: 1000, 2500 or 5000")
    liabilityLimit: Literal[100000, 300000, 500000, 1000000] = Field(  # noqa: N815
        description="Personal liability limit in US dollars"
    )
    endorsements: list[Endorsement] = Field(description="Optional endorsements requested, empty when none")


class ContactRequest(_Record):
    """Consent to an agent's follow-up and, only with it, how to reach the customer (owned by ContactStep)."""

    consentToContact: bool = Field(description="True only if the customer explicitly agreed to be contacted")  # noqa: N815
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=120)] | None
    email: Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")] | None
    phone: Annotated[str, StringConstraints(strip_whitespace=True, min_length=7, max_length=30)] | None
    propertyAddress: Annotated[str, StringConstraints(strip_whitespace=True, min_length=5, max_length=240)] | None  # noqa: N815


#: The contact record kept when the customer declines: nothing they may have said is retained.
NO_CONTACT = {"consentToContact": False, "name": None, "email": None, "phone": None, "propertyAddress": None}


# -- tool arguments that are not application records ----------------------------------------------


class NoArguments(BaseModel):
    """Arguments of a tool that takes none."""


class ConfirmArgs(BaseModel):
    """The customer's confirmation of the reviewed application."""

    confirmed: Literal[True]


class CorrectionArgs(BaseModel):
    """Send one correction to the step that owns the corrected fact."""

    section: CorrectionSection = Field(
        description="qualification (location, occupancy, start date), property (building, roof, updates), "
        "risk (claims, hazards, protections) or coverage (limits, deductible, endorsements)"
    )
    change: str = Field(min_length=1, max_length=500, description="The requested change in the customer's words")


class CompareArgs(BaseModel):
    """Option ids to compare side by side."""

    optionIds: list[Annotated[str, StringConstraints(min_length=1)]] = Field(min_length=1, max_length=3)  # noqa: N815


class SelectArgs(BaseModel):
    """The option the customer chooses."""

    optionId: str = Field(min_length=1, description="An option id of the current quote, e.g. ENHANCED")  # noqa: N815


class DeductibleArgs(BaseModel):
    """A new deductible for re-rating the current quote."""

    deductible: Deductible


class AcknowledgeArgs(BaseModel):
    """The customer heard the referral's explanation."""

    acknowledged: bool
