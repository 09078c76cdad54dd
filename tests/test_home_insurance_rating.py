"""HomeInsuranceQuoteFlow's rating against figures derived independently from the published demo rules.

The rules (Evergreen Home Insurance, ``2027.1-demo``): the premium of a tier is dwelling coverage / 1000 x 3.2,
times the home-age, roof-age, construction, occupancy, deductible and claim-count factors, times the hazard
multipliers, times (1 - protection discounts), times the tier's factor, plus the annual fee of every
endorsement the option carries (requested ones and the tier's own), rounded to the cent; the monthly figure
is the annual one / 12, rounded. Referral and unsupported decisions carry reason codes and no options.
Here those rules are applied in exact decimal arithmetic and compared with ``quote``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flows.home_insurance.jsontext import js_number, js_stringify
from flows.home_insurance.rating import money, quote
from flows.home_insurance.records import (
    ContactRequest,
    CoveragePreferences,
    PropertyProfile,
    Qualification,
    RiskProfile,
)

# The rules as published, written out again here rather than read from the flow's file.
BASE = Decimal("3.2")
DEDUCTIBLE = {1000: Decimal(1), 2500: Decimal("0.9"), 5000: Decimal("0.81")}
CONSTRUCTION = {"wood_frame": Decimal("1.05"), "masonry": Decimal("0.96"), "mixed": Decimal(1)}
OCCUPANCY = {"primary": Decimal(1), "secondary": Decimal("1.18"), "rental": Decimal("1.3")}
HOME_AGE = [(10, Decimal("0.92")), (25, Decimal(1)), (50, Decimal("1.12")), (100, Decimal("1.28"))]
ROOF_AGE = [(5, Decimal("0.93")), (15, Decimal(1)), (25, Decimal("1.17"))]
CLAIMS = [Decimal(1), Decimal("1.12"), Decimal("1.35")]
HAZARD = {"pool": Decimal("1.08"), "trampoline": Decimal("1.1"), "woodStove": Decimal("1.07")}
DISCOUNT = {"monitoredAlarm": Decimal("0.05"), "sprinklerSystem": Decimal("0.08")}
FEES = {"water_backup": 48, "identity_theft": 24, "equipment_breakdown": 36}
TIERS = [
    ("ESSENTIAL", Decimal(1), 0, 100_000, []),
    ("ENHANCED", Decimal("1.13"), 10, 500_000, ["water_backup", "equipment_breakdown"]),
    ("PREMIER", Decimal("1.26"), 25, 1_000_000, ["water_backup", "identity_theft", "equipment_breakdown"]),
]
CENT = Decimal("0.01")

NOW = datetime(2027, 7, 15, tzinfo=UTC)
#: The original demo's own test application; its engine quotes 1556.12 / 1788.18 / 2008.24 for it.
REFERENCE = {
    "qualification": {"state": "OR", "zip": "97205", "purchaseStatus": "buying", "occupancy": "primary",
                      "effectiveDate": "2027-10-01"},
    "property": {"dwellingType": "single_family", "yearBuilt": 1998, "squareFeet": 2100, "stories": 2,
                 "construction": "wood_frame", "roofMaterial": "composition", "roofAgeYears": 4,
                 "plumbingUpdatedYear": 2018, "electricalUpdatedYear": 2018, "hvacUpdatedYear": 2022},
    "risk": {"claims": [{"year": 2024, "type": "water", "amount": 7000}],
             "hazards": {"pool": False, "trampoline": False, "woodStove": False},
             "protections": {"smokeAlarms": True, "burglarAlarm": True, "monitoredAlarm": True,
                             "sprinklerSystem": False}},
    "coverage": {"dwellingCoverage": 450000, "deductible": 2500, "liabilityLimit": 500000,
                 "endorsements": ["water_backup"]},
}


def band(value: int, bands: list[tuple[int, Decimal]]) -> Decimal:
    return next((factor for limit, factor in bands if value <= limit), bands[-1][1])


def expected_reasons(app: dict[str, Any], now: datetime) -> list[str]:
    recent = [claim for claim in app["risk"]["claims"] if claim["year"] >= now.year - 5]
    return [code for code, hit in (
        ("UNSUPPORTED_STATE", app["qualification"]["state"] != "OR"),
        ("HIGH_DWELLING_LIMIT", app["coverage"]["dwellingCoverage"] > 1_500_000),
        ("ROOF_AGE_REVIEW", app["property"]["roofAgeYears"] > 25),
        ("HISTORIC_HOME_REVIEW", app["property"]["yearBuilt"] < 1900),
        ("CLAIMS_FREQUENCY_REVIEW", len(recent) > 2),
        ("LARGE_CLAIM_REVIEW", any(claim["amount"] > 50_000 for claim in recent)),
    ) if hit]


def expected_options(app: dict[str, Any], now: datetime) -> list[dict[str, Any]]:
    home, risk, coverage = app["property"], app["risk"], app["coverage"]
    core = (Decimal(coverage["dwellingCoverage"]) / 1000 * BASE
            * band(max(0, now.year - home["yearBuilt"]), HOME_AGE) * band(home["roofAgeYears"], ROOF_AGE)
            * CONSTRUCTION[home["construction"]] * OCCUPANCY[app["qualification"]["occupancy"]]
            * DEDUCTIBLE[coverage["deductible"]] * CLAIMS[min(len(risk["claims"]), 2)])
    for name, factor in HAZARD.items():
        core *= factor if risk["hazards"][name] else 1
    core *= 1 - sum((share for name, share in DISCOUNT.items() if risk["protections"][name]), Decimal(0))
    options = []
    for tier_id, factor, extension, liability, included in TIERS:
        endorsements = list(dict.fromkeys(coverage["endorsements"] + included))
        annual = (core * factor + sum(FEES[name] for name in endorsements)).quantize(CENT, ROUND_HALF_UP)
        options.append({"id": tier_id, "annual": annual, "monthly": (annual / 12).quantize(CENT, ROUND_HALF_UP),
                        "extension": extension, "liability": max(coverage["liabilityLimit"], liability),
                        "endorsements": endorsements})
    return options


def within_a_cent(actual: float, exact: Decimal) -> bool:
    # Binary floating point may land a half cent on the other side; never further.
    return abs(Decimal(str(actual)) - exact) <= CENT


def test_the_original_demo_application_is_quoted_as_the_original_quotes_it() -> None:
    result = quote(REFERENCE, NOW)
    assert result["decision"] == "eligible" and result["reasonCodes"] == []
    assert [o["annualPremium"] for o in result["options"]] == [1556.12, 1788.18, 2008.24]
    assert [o["monthlyPremium"] for o in result["options"]] == [129.68, 149.02, 167.35]
    # The id the original's engine gives this application on this day.
    assert result["quoteId"] == "EHI-20270715-82009836"
    assert (result["rulesVersion"], result["generatedAt"], result["validThrough"]) == (
        "2027.1-demo", "2027-07-15T00:00:00.000Z", "2027-08-14")
    assert [o["endorsements"] for o in result["options"]] == [
        ["water_backup"], ["water_backup", "equipment_breakdown"],
        ["water_backup", "identity_theft", "equipment_breakdown"],
    ]
    assert [o["liabilityLimit"] for o in result["options"]] == [500000, 500000, 1000000]


def test_a_naive_instant_is_utc_and_other_zones_are_converted() -> None:
    aware = quote(REFERENCE, datetime(2027, 7, 14, 20, 0, tzinfo=UTC))
    naive = quote(REFERENCE, datetime(2027, 7, 14, 20, 0))
    assert aware == naive and aware["quoteId"].startswith("EHI-20270714-")
    from zoneinfo import ZoneInfo

    tokyo = quote(REFERENCE, datetime(2027, 7, 15, 5, 0, tzinfo=ZoneInfo("Asia/Tokyo")))
    assert tokyo == aware


applications = st.fixed_dictionaries({
    "qualification": st.fixed_dictionaries({
        "state": st.sampled_from(["OR", "OR", "OR", "WA", "CA"]),
        "zip": st.from_regex(r"\A\d{5}\Z"),
        "purchaseStatus": st.sampled_from(["own", "buying", "refinancing"]),
        "occupancy": st.sampled_from(list(OCCUPANCY)),
        "effectiveDate": st.just("2027-10-01"),
    }),
    "property": st.fixed_dictionaries({
        "dwellingType": st.sampled_from(["single_family", "townhome", "duplex"]),
        "yearBuilt": st.integers(1850, 2027),
        "squareFeet": st.integers(400, 15000),
        "stories": st.sampled_from([1, 2, 3, 1.5]),
        "construction": st.sampled_from(list(CONSTRUCTION)),
        "roofMaterial": st.sampled_from(["composition", "metal", "tile"]),
        "roofAgeYears": st.integers(0, 40),
        "plumbingUpdatedYear": st.one_of(st.none(), st.integers(2000, 2027)),
        "electricalUpdatedYear": st.one_of(st.none(), st.integers(2000, 2027)),
        "hvacUpdatedYear": st.one_of(st.none(), st.integers(2000, 2027)),
    }),
    "risk": st.fixed_dictionaries({
        "claims": st.lists(st.fixed_dictionaries({
            "year": st.integers(2000, 2027),
            "type": st.sampled_from(["water", "fire", "wind", "theft", "liability", "other"]),
            "amount": st.one_of(st.integers(0, 80_000), st.floats(0, 80_000).map(lambda x: round(x, 2))),
        }), max_size=4),
        "hazards": st.fixed_dictionaries({name: st.booleans() for name in HAZARD}),
        "protections": st.fixed_dictionaries(
            {name: st.booleans() for name in ("smokeAlarms", "burglarAlarm", "monitoredAlarm", "sprinklerSystem")}
        ),
    }),
    "coverage": st.fixed_dictionaries({
        "dwellingCoverage": st.integers(100_000, 2_000_000),
        "deductible": st.sampled_from(list(DEDUCTIBLE)),
        "liabilityLimit": st.sampled_from([100000, 300000, 500000, 1000000]),
        "endorsements": st.lists(st.sampled_from(list(FEES)), unique=True),
    }),
})


@settings(max_examples=300, deadline=None)
@given(app=applications, days=st.integers(0, 700))
def test_quotes_agree_with_the_rules_applied_in_exact_arithmetic(app: dict[str, Any], days: int) -> None:
    now = datetime(2026, 3, 1, 9, 30, tzinfo=UTC) + timedelta(days=days)
    result = quote(app, now)
    reasons = expected_reasons(app, now)
    assert result["reasonCodes"] == reasons
    decision = "unsupported" if "UNSUPPORTED_STATE" in reasons else "referral" if reasons else "eligible"
    assert result["decision"] == decision
    assert result["validThrough"] == (now + timedelta(days=30)).date().isoformat()
    text = json.dumps(app, separators=(",", ":"), ensure_ascii=False)
    if "." not in text:  # no fractional numbers: Python's JSON text is JavaScript's
        digest = hashlib.sha256(text.encode()).hexdigest()[:8].upper()
        assert result["quoteId"] == f"EHI-{now:%Y%m%d}-{digest}"
    if decision != "eligible":
        assert result["options"] == []
        return
    expected = expected_options(app, now)
    assert [o["id"] for o in result["options"]] == [e["id"] for e in expected]
    for option, exact in zip(result["options"], expected, strict=True):
        assert within_a_cent(option["annualPremium"], exact["annual"]), (option, exact)
        assert option["monthlyPremium"] == money(option["annualPremium"] / 12)
        assert within_a_cent(option["monthlyPremium"], exact["monthly"])
        assert option["dwellingExtensionPercent"] == exact["extension"]
        assert option["liabilityLimit"] == exact["liability"]
        assert option["endorsements"] == exact["endorsements"]
        assert option["dwellingCoverage"] == app["coverage"]["dwellingCoverage"]
        assert option["deductible"] == app["coverage"]["deductible"]


@given(app=applications)
@settings(max_examples=50, deadline=None)
def test_the_flows_records_accept_what_the_rules_rate_and_keep_its_json(app: dict[str, Any]) -> None:
    parts = {"qualification": Qualification, "property": PropertyProfile, "risk": RiskProfile,
             "coverage": CoveragePreferences}
    saved = {part: record.model_validate(app[part]).model_dump(mode="json") for part, record in parts.items()}
    # Same values and the same number types (a stored 2 must not come back as 2.0).
    assert json.dumps(saved, sort_keys=True) == json.dumps(app, sort_keys=True)
    assert list(saved) == ["qualification", "property", "risk", "coverage"]


def test_contact_details_are_trimmed_and_an_email_must_look_like_one() -> None:
    request = ContactRequest.model_validate({"consentToContact": True, "name": " Jamie ", "email": "j@example.com",
                                             "phone": None, "propertyAddress": None})
    assert request.name == "Jamie"
    try:
        ContactRequest.model_validate({**request.model_dump(), "email": "not-an-email"})
    except ValueError:
        pass
    else:
        raise AssertionError("an invalid email was accepted")


def test_json_text_is_javascripts() -> None:
    # Each pair is what JavaScript's JSON.stringify writes for the value.
    for value, text in [(7000.0, "7000"), (1.5, "1.5"), (0.00001, "0.00001"), (1e-7, "1e-7"), (1e21, "1e+21"),
                        (123456789012345680000.0, "123456789012345680000"), (-0.0, "0"),
                        (0.1 + 0.2, "0.30000000000000004"),
                        (2**53, "9007199254740992"), (float("nan"), "null")]:
        assert js_number(value) == text, value
    assert js_stringify({"b": [1, 2.0, None, True], "10": "x", "2": "\u2028\ud800", "a": {}}) == (
        '{"2":"\u2028\\ud800","10":"x","b":[1,2,null,true],"a":{}}'
    )


def test_money_rounds_half_cents_up() -> None:
    assert [money(1.005), money(2.675), money(0.125), money(1556.115)] == [1.01, 2.68, 0.13, 1556.12]
