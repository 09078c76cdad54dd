"""The original demo's scenario files run offline with the scripts shipped beside each bundled flow.

The scenario files themselves stay in the original's repository; each ``ORIGINAL_*`` below is this project's own
transcription of one: its flow, the number of turns and which one completes the session, and each turn's gist in
our words. ``picoflow eval <file> --script flows/<flow>/original_replies.json --judge scripted --judge-script
flows/<flow>/original_judge.json`` must pass on it, and the replies must take the flow where the original's turns
expect it (checked on the stored session).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.basic import BasicFlow
from flows.home_insurance import HomeInsuranceQuoteFlow
from flows.hotel import HotelFlow
from flows.support import SupportFlow
from picoflow import FlowEngine
from picoflow.aws import runtime as aws_runtime
from picoflow.local import cli
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.memory_store import MemorySessionStore

ROOT = Path(__file__).resolve().parents[1]

#: test/basic-flow/basic-flow.scenario.json: weather for two cities, favourites, name, birth date, address.
ORIGINAL_BASIC = ("BasicFlow", [
    "greeting", "two unsupported cities", "LA and NYC", "a colour", "a movie", "a season",
    "a placeholder name", "an accepted name", "a birth date", "an address",
])
#: test/hotel-flow/hotel-flow.scenario.json: an August 2027 week, suites then two beds, comparisons, booking #8.
ORIGINAL_HOTEL = ("HotelFlow", [
    "greeting", "yes, Portland", "August 1 to 8, 2027", "at most $700", "a suite", "WiFi and parking",
    "no distance limit", "search", "two beds, search again", "hotels 2, 5 and 8 on price", "the same on amenities",
    "hotels 2 and 5 on price", "back to booking", "number 8",
])
#: test/home-insurance-flow/home-insurance-flow.scenario.json: twenty turns to a selected Enhanced option.
ORIGINAL_HOME_INSURANCE = ("HomeInsuranceQuoteFlow", [
    "asks for a quote", "Oregon 97205", "buying, primary, from 1 October 2027", "single-family, 1998",
    "2,100 sq ft, two stories, wood frame", "composition roof, 6 years", "updates 2018, 2018, 2022",
    "one 2024 water claim", "no hazards", "alarms, monitored, no sprinklers", "$450,000 to rebuild",
    "$2,500 deductible", "$500,000 liability", "water backup", "roof is 4 years", "confirmed, quote",
    "compare Essential and Enhanced", "$5,000 deductible", "select Enhanced", "consent, name and email",
])

#: test/support-flow/support-flow.scenario.json: verify NW-100412, a jacket refund declined at approval, the base
#: layers refunded, a disputed charge, the case closed.
ORIGINAL_SUPPORT = ("SupportFlow", [
    "needs help with an order", "NW-100412 with its email", "return the rain jacket", "too big",
    "hold off", "the merino base layers instead, no longer needed", "the charge looks wrong",
    "CH-88301 is more than expected", "that is everything",
])


def scenario_file(path: Path, transcription: tuple[str, list[str]], min_scores: dict[int, float]) -> Path:
    """A scenario in the original's format from a transcription (no config, the last turn completes)."""
    flow, turns = transcription
    document = {"flowName": flow, "judgeModel": "gpt-4o", "judgeMinScore": 0.75, "turns": [
        {"label": gist, "input": gist, "expectedResponse": f"Handles: {gist}.", "completed": number == len(turns),
         **({"minScore": min_scores[number]} if number in min_scores else {})}
        for number, gist in enumerate(turns, start=1)
    ]}
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("PICOFLOW_SCRIPT", "PICOFLOW_FLOWS", "SESSION_STORE", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                 "OPENAI_API_KEY_PARAMETER"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    # The original's runners pin the date the same way: its scenarios carry no config.
    monkeypatch.setenv("HOTEL_FLOW_CURRENT_DATE", "2027-07-15")
    monkeypatch.setenv("HOME_INSURANCE_FLOW_CURRENT_DATE", "2027-07-15T00:00:00.000Z")
    monkeypatch.setenv("SUPPORT_FLOW_CURRENT_DATE", "2027-07-15")
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)
        aws_runtime._runtime = None


@pytest.mark.parametrize(("folder", "transcription", "min_scores"), [
    ("basic", ORIGINAL_BASIC, {}),
    ("hotel", ORIGINAL_HOTEL, {11: 0.8}),
    ("home_insurance", ORIGINAL_HOME_INSURANCE, {}),
    ("support", ORIGINAL_SUPPORT, {4: 0.8, 5: 0.8, 6: 0.8}),
])
def test_the_original_scenarios_pass_with_the_shipped_scripts(
    folder: str, transcription: tuple[str, list[str]], min_scores: dict[int, float], tmp_path: Path
) -> None:
    scenario = scenario_file(tmp_path / "scenario.json", transcription, min_scores)
    judge = json.loads((ROOT / "flows" / folder / "original_judge.json").read_text())
    assert len(judge) == len(transcription[1])
    status = cli.main(["eval", str(scenario), "--script", f"flows/{folder}/original_replies.json",
                       "--judge", "scripted", "--judge-script", f"flows/{folder}/original_judge.json",
                       "--json", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert status == 0 and report["passed"] is True


async def replay(flow: type, folder: str, turns: list[str]) -> tuple[Any, ScriptedProvider, list[Any]]:
    """The turns through an engine answered by the shipped script; the final document, provider and responses."""
    provider = ScriptedProvider(json.loads((ROOT / "flows" / folder / "original_replies.json").read_text()))
    engine = FlowEngine([flow], MemorySessionStore(), ProviderRegistry(override=provider), retry_delay=0)
    session, responses = None, []
    for text in turns:
        response = await engine.run(flow.__name__, text, session)
        assert response.success, response.message
        session = response.session
        responses.append(response)
    doc = await engine.session_store.load(session)
    # Every compaction found its scripted summary.
    assert not [w.message for w in doc.warn if "compaction skipped" in w.message]
    return doc, provider, responses


def state(doc: Any, step: str) -> dict[str, Any]:
    return next(s.state for s in doc.flow.steps if s.name == step)


async def test_the_hotel_script_compares_and_books_the_hotels_the_original_names() -> None:
    doc, provider, responses = await replay(HotelFlow, "hotel", ORIGINAL_HOTEL[1])
    assert provider.remaining == 0
    assert [r.completed for r in responses] == [False] * 13 + [True]
    header = responses[9].message.splitlines()[0]
    for name in ("Hampton Inn Portland-Airport", "Hampton Inn Portland/Clackamas", "Hampton Inn Sherwood Portland"):
        assert name in header
    assert "Hampton Inn Sherwood Portland" not in responses[11].message.splitlines()[0]
    booked = state(doc, "PresentStep")["booking"]
    assert booked["hotel"] == "Hampton Inn Sherwood Portland"
    assert (booked["start"], booked["end"], booked["room_type"]) == ("2027-08-01", "2027-08-08", "two beds")
    assert f"Confirmation number: {booked['confirmation']}" in responses[-1].message
    assert "choosing Hilton" in responses[-1].message


async def test_the_home_insurance_script_ends_where_the_originals_runner_checks() -> None:
    doc, provider, responses = await replay(HomeInsuranceQuoteFlow, "home_insurance", ORIGINAL_HOME_INSURANCE[1])
    assert provider.remaining == 0
    assert [r.completed for r in responses] == [False] * 19 + [True]
    assert doc.run_status == "completed"
    assert state(doc, "QualificationStep")["qualification"]["zip"] == "97205"
    assert state(doc, "PropertyStep")["property"]["roofAgeYears"] == 4
    assert state(doc, "CoverageStep")["coverage"]["deductible"] == 5000
    assert state(doc, "RateQuoteStep")["quoteResult"]["decision"] == "eligible"
    assert state(doc, "PresentQuoteStep")["selectedOption"]["id"] == "ENHANCED"
    assert state(doc, "ContactStep")["contact"] == {
        "consentToContact": True, "name": "Jamie Rivera", "email": "jamie.rivera@example.com",
        "phone": None, "propertyAddress": None,
    }
    # Turn 16 shows the three options; turn 18 re-rates under a new reference.
    assert "| Essential (ESSENTIAL) |" in responses[15].message and "| Premier (PREMIER) |" in responses[15].message
    first, second = (r.message.splitlines()[0] for r in (responses[15], responses[17]))
    assert first.startswith("### Preliminary home insurance quote EHI-20270715-") and first != second


async def test_the_basic_script_refuses_the_placeholder_and_completes() -> None:
    doc, provider, responses = await replay(BasicFlow, "basic", ORIGINAL_BASIC[1])
    assert provider.remaining == 0
    assert [r.completed for r in responses] == [False] * 9 + [True]
    assert state(doc, "FavoritesStep")["favorites"] == {
        "favoriteColor": "blue", "favoriteMovie": "Star Wars", "favoriteSeason": "summer"}
    assert state(doc, "NameStep")["name"] == "Joe Cline"


async def test_the_support_script_declines_then_refunds_and_opens_a_ticket() -> None:
    doc, provider, responses = await replay(SupportFlow, "support", ORIGINAL_SUPPORT[1])
    assert provider.remaining == 0
    assert [r.completed for r in responses] == [False] * 8 + [True]
    triage = state(doc, "TriageStep")
    (refund,) = triage["refunds"]
    assert (refund["lineIds"], refund["netRefund"], refund["refundTarget"]) == (["L2"], 136.0, "Visa ending 4021")
    assert refund["rma"] in responses[5].message and refund["rma"] in responses[8].message
    (ticket,) = triage["tickets"]
    assert ticket["ticketId"] in responses[7].message and ticket["amountInDispute"] == 439.95
    # Turn 4 stopped at the approval gate with the $289.00 breakdown; turn 5 dropped it.
    assert [item.step_name for item in doc.flow.sequence][:5] == [
        "TriageStep", "ReturnsStep", "AdjudicateStep", "ApprovalStep", "ReturnsStep"]
    assert "| **Net refund to Visa ending 4021** | **$289.00** |" in responses[3].message
    assert "pending" not in state(doc, "ApprovalStep")
