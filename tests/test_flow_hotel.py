"""HotelFlow: pricing and search helpers, handler-level validation, and the scripted 14-turn conversation."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import date
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

import handlers.api as api
from flows.hotel import HotelFlow, booking, catalog, chart, contract
from flows.hotel.pricing import day_price, prices
from flows.hotel.steps import ExploreStep
from picoflow import FlowEngine
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.messages import SUMMARY_MESSAGE_PREFIX, TurnNotesMessage, message_step
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.mcp_servers import HttpServer

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

CONVERSATION = json.loads((Path(catalog.__file__).parent / "conversation.json").read_text(encoding="utf-8"))
TODAY = date(2026, 3, 22)
SUITES = {
    "start": "2026-07-01",
    "end": "2026-07-06",
    "room_type": "suite",
    "amenities": ["freeWiFi", "freeParking"],
    "max_price": 700,
}


# -- pricing (the bundled server) ---------------------------------------------------------------------


def bundled(criteria: dict[str, Any]) -> list[dict[str, Any]]:
    """The bundled server's answer for the flow's criteria, each entry also under the flow's ``hotel`` key."""
    request = {
        "startDate": criteria["start"], "endDate": criteria["end"], "amenities": criteria.get("amenities") or [],
        "roomTypes": [criteria["room_type"]],
        "budget": {"min": criteria.get("min_price"), "max": criteria.get("max_price")},
        "maxDistanceMiles": {"airport": criteria.get("max_airport_miles"),
                             "cityCenter": criteria.get("max_city_center_miles")},
    }
    return [{"hotel": entry["hotelName"], **entry} for entry in catalog.search(request)]


def test_month_room_weekend_and_holiday_multipliers_compound() -> None:
    # Wednesday 1 July 2026 to Monday 6 July: July 1.8, two beds 1.6, Saturday and Sunday 1.15, 4 July 1.2.
    assert [round(price, 4) for price in prices(108, "two beds", date(2026, 7, 1), date(2026, 7, 6))] == [
        311.04, 311.04, 311.04, 429.2352, 357.696, 311.04]
    assert day_price(100, "suite", date(2026, 3, 3)) == 300.0  # March 1.2 x suite 2.5
    assert day_price(100, None, date(2026, 10, 14)) == pytest.approx(180.0)  # October 1.5 x the 14 October holiday
    assert day_price(100, "one bed", date(2026, 11, 26)) == 120.0  # Thanksgiving 2026 is not on its list


def test_every_day_of_the_stay_is_priced_check_out_day_included() -> None:
    assert len(prices(100, "one bed", date(2026, 7, 1), date(2026, 7, 6)) or []) == 6
    assert prices(100, "one bed", date(2026, 7, 1), date(2026, 7, 1)) == [180.0]
    # Dates given the wrong way round are swapped; a hotel without a base price has no prices.
    assert prices(100, "one bed", date(2026, 7, 3), date(2026, 7, 1)) == prices(
        100, "one bed", date(2026, 7, 1), date(2026, 7, 3))
    assert prices(None, "one bed", date(2026, 7, 1), date(2026, 7, 2)) is None
    assert prices(0, "one bed", date(2026, 7, 1), date(2026, 7, 2)) is None


def test_a_hotel_without_a_base_price_is_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    unpriced = {**catalog.hotel("Hilton Garden Inn Beaverton"), "level": None}
    priced = catalog.hotel("Hampton Inn Sherwood Portland")
    monkeypatch.setattr(catalog, "hotels", lambda: (unpriced, priced))
    assert [entry["hotel"] for entry in bundled(SUITES)] == ["Hampton Inn Sherwood Portland"]


# -- search and choices ----------------------------------------------------------------------------


def test_search_keeps_catalog_order_and_sums_every_priced_day() -> None:
    found = bundled(SUITES)
    assert [(entry["hotel"], entry["total"]) for entry in found] == [
        ("Hilton Garden Inn Beaverton", 2997.27),
        ("Hampton Inn Sherwood Portland", 3173.58),
    ]
    assert found[0]["prices"] == [459.0, 459.0, 459.0, 633.42, 527.85, 459.0]
    two_beds = [entry["hotel"] for entry in bundled({**SUITES, "room_type": "two beds"})]
    assert two_beds == [
        "Hampton Inn & Suites Portland Tigard", "Hampton Inn Portland-Airport", "Hilton Garden Inn Portland Airport",
        "Hilton Garden Inn Beaverton", "Hampton Inn Portland/Clackamas", "Tru by Hilton Aloha Beaverton",
        "Hampton Inn Portland East", "Hampton Inn Sherwood Portland", "Hilton Garden Inn Wilsonville Portland",
    ]


def test_search_applies_budget_and_distance_limits() -> None:
    def names(**extra: Any) -> list[str]:
        return [entry["hotel"] for entry in bundled({**SUITES, "room_type": "two beds", **extra})]

    # The dearest day must fit the maximum, the cheapest the minimum; 0 is no limit, as in the original.
    assert names(max_price=420) == ["Hilton Garden Inn Beaverton"]  # Sherwood's $429.24 Saturday is too dear
    assert names(max_price=0) == names()
    assert names(min_price=340) == ["Hampton Inn Portland-Airport", "Hilton Garden Inn Portland Airport",
                                    "Hampton Inn Portland East", "Hilton Garden Inn Wilsonville Portland"]
    # Distances are strict: an airport 3 miles away is not "within 3 miles".
    assert names(max_airport_miles=3) == ["Hampton Inn Portland-Airport"]
    assert names(max_city_center_miles=8) == []
    assert names(max_city_center_miles=8.5) == ["Hampton Inn Portland/Clackamas"]


def test_date_rules() -> None:
    assert booking.date_problem("2026-07-01", "2026-07-06", TODAY) is None
    assert "YYYY-MM-DD" in booking.date_problem("07/01/2026", "2026-07-06", TODAY)
    assert "YYYY-MM-DD" in booking.date_problem("2026-02-30", "2026-03-02", TODAY)
    assert "after today (2026-03-22)" in booking.date_problem("2026-03-22", "2026-03-25", TODAY)
    assert "after the check-in" in booking.date_problem("2026-07-06", "2026-07-01", TODAY)
    assert "30 nights" in booking.date_problem("2026-07-01", "2026-08-15", TODAY)


def test_pick_resolves_numbers_and_names_and_refuses_the_rest() -> None:
    found = bundled({**SUITES, "room_type": "two beds"})
    assert [e["hotel"] for e in booking.pick(found, ["9", "#2", "tru by hilton aloha beaverton"])] == [
        "Hilton Garden Inn Wilsonville Portland",
        "Hampton Inn Portland-Airport",
        "Tru by Hilton Aloha Beaverton",
    ]
    for refs in (["10"], ["0"], ["The Ritz"], ["2", "Hampton Inn Portland-Airport"], []):
        assert booking.pick(found, refs) is None


def test_confirmation_number_is_stable_per_session_and_hotel() -> None:
    number = booking.confirmation_number("session-1", "Hampton Inn Portland-Airport")
    assert len(number) == 6 and number.isdigit()
    assert number == booking.confirmation_number("session-1", "Hampton Inn Portland-Airport")
    assert number != booking.confirmation_number("session-2", "Hampton Inn Portland-Airport")


def test_table_pads_each_column_to_its_own_width() -> None:
    lines = chart.table(["Feature", "A", "Much longer"], [["x", "1", "2"], ["yy", "333", "4"]]).splitlines()
    assert lines == [
        "| Feature | A   | Much longer |",
        "| ------- | --- | ----------- |",
        "| x       | 1   | 2           |",
        "| yy      | 333 | 4           |",
    ]


def _entry(name: str, **details: Any) -> dict[str, Any]:
    return {"hotel": name, "nights": ["2026-07-01"], "prices": [100.0], "total": 100.0,
            "amenities": None, "room_types": None, "distance": None, **details}


def test_comparisons_mark_what_a_server_did_not_report() -> None:
    criteria = {**SUITES, "max_airport_miles": 10, "max_city_center_miles": None}
    known = _entry("Known", amenities=["freeWiFi", "freeParking", "indoorPool"], room_types=["one bed", "suite"],
                   distance={"airport": 9.5, "cityCenter": 2.0})
    bare = _entry("Bare")
    amenities = chart.comparison("amenities", [known, bare], criteria)
    assert amenities.splitlines()[2:5] == [
        "| freeParking | ✅     | ✅    |",
        "| freeWiFi    | ✅     | ✅    |",
        "| indoorPool  | ✅     | n/a  |",
    ]
    assert amenities.endswith("did not report the amenities of Bare: only what the search asked for is known.")
    rooms = chart.comparison("room type", [known, bare], criteria).splitlines()
    assert rooms[2:5] == [
        "| one bed  | ✅     | n/a  |",
        "| two beds | ❌     | n/a  |",
        "| suite    | ✅     | ✅    |",
    ]
    distance = chart.comparison("distance", [known, bare], criteria).splitlines()
    assert distance[2:4] == ["| Airport     | 9.5 mi | within 10 mi |", "| City center | 2 mi   | n/a          |"]
    # Nothing asked for and nothing reported: said in words rather than an empty table.
    nothing = chart.comparison("amenities", [bare, _entry("Also bare")], {**criteria, "amenities": []})
    assert nothing == "The hotel search service does not report the amenities of these hotels."
    assert "did not report" not in chart.comparison("price", [known, bare], criteria)


def test_the_catalog_speaks_the_contracts_vocabulary() -> None:
    """HotelFlow offers the model the contract's amenities: each is one some bundled hotel has."""
    assert {name for hotel in catalog.hotels() for name in hotel["amenities"]} == set(contract.AMENITIES)
    assert {room for hotel in catalog.hotels() for room in hotel["roomType"]} == set(contract.ROOM_TYPES)


def test_hotelflow_knows_hotels_only_through_the_search_contract() -> None:
    """The flow's modules never read the bundled server's catalog or pricing, so any server will do."""
    import ast

    server_side = {"flows.hotel.catalog", "flows.hotel.pricing", "flows.hotel.mcp_server"}
    for module in ("flow", "steps", "chart", "booking", "contract"):
        tree = ast.parse((Path(catalog.__file__).parent / f"{module}.py").read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {f"{node.module}.{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     for alias in node.names}
        assert not imported & server_side, module


def test_current_date_comes_from_config_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    flow = HotelFlow()
    step = ExploreStep(flow)
    monkeypatch.setenv("HOTEL_FLOW_CURRENT_DATE", "2027-07-15T00:00:00.000Z")
    assert step.today() == date(2027, 7, 15)
    flow.add_context({"config": {"currentDate": "2026-03-22"}})
    assert step.today() == date(2026, 3, 22)
    monkeypatch.delenv("HOTEL_FLOW_CURRENT_DATE")
    assert ExploreStep(HotelFlow()).today() == date.today()


# -- validation inside the flow (engine, memory store) ---------------------------------------------


def _reply(text: str) -> dict[str, Any]:
    return {"content": text, "usage": {"input_tokens": 10, "output_tokens": 5}}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}], "usage": {"input_tokens": 10, "output_tokens": 5}}


class Session:
    """A HotelFlow session on the memory store, answered by a scripted model."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.provider = ScriptedProvider(script)
        self.engine = FlowEngine(
            flows=[HotelFlow],
            session_store=MemorySessionStore(),
            providers=ProviderRegistry(override=self.provider),
            retry_delay=0,
        )
        self.id: str | None = None

    async def say(self, text: str) -> Any:
        response = await self.engine.run("HotelFlow", text, self.id, {"currentDate": "2026-03-22"})
        assert response.success, response.message
        self.id = response.session
        return response

    async def doc(self) -> Any:
        return await self.engine.session_store.load(self.id)


def _tool_results(doc: Any, namespace: str) -> list[str]:
    return [m.content for m in doc.flow.memory[namespace].messages if m.type == "tool"]


async def test_bad_dates_and_empty_results_keep_the_explore_step() -> None:
    session = Session(
        [
            _call("capture_choices", {"criteria": {**SUITES, "start": "2026-03-01"}}),
            _reply("Check-in must be after today. Which dates?"),
            _call("capture_choices", {"criteria": {**SUITES, "max_price": 50}}),
            _reply("Nothing fits $50 a night. Could you raise the budget?"),
        ]
    )
    response = await session.say("suite, 3/1 to 7/6, search")
    doc = await session.doc()
    assert response.message == "Check-in must be after today. Which dates?"
    assert doc.flow.current_step == "ExploreStep"
    assert "criteria" not in doc.flow.steps[0].state
    assert "after today (2026-03-22)" in _tool_results(doc, "hotel-explore")[-1]
    # The model saw the feedback as the result of its own call before answering (then the step's turn notes).
    assert isinstance(session.provider.calls[1][-2], ToolMessage)
    assert isinstance(session.provider.calls[1][-1], TurnNotesMessage)

    await session.say("max 50 a night, search")
    doc = await session.doc()
    assert doc.flow.current_step == "ExploreStep"
    assert doc.flow.steps[0].state["criteria"]["max_price"] == 50
    assert _tool_results(doc, "hotel-explore")[-1].startswith("No hotel matches")


async def test_unknown_hotels_are_refused_before_comparing_or_booking() -> None:
    session = Session(
        [
            _call("capture_choices", {"criteria": SUITES}),
            _reply("1-4 listed"),
            _call("go_compare", {"hotels": ["2", "The Ritz"]}),
            _reply("Please pick two hotels from the list."),
            _call("chosen_hotel", {"hotel": "The Ritz"}),
            _reply("The Ritz is not in the list; choose 1 or 2."),
            _call("chosen_hotel", {"hotel": "hampton inn sherwood portland"}),
        ]
    )
    await session.say("search")
    await session.say("compare 2 and the Ritz")
    response = await session.say("book the Ritz")
    doc = await session.doc()
    assert response.completed is False and doc.flow.current_step == "PresentStep"
    assert _tool_results(doc, "PresentStep")[-2:] == [
        "Ask the user for at least two different hotels from the list to compare.",
        "'The Ritz' is not in the list. Ask the user to choose 1 to 2.",
    ]
    assert "booking" not in doc.flow.steps[1].state

    response = await session.say("the Sherwood one")
    doc = await session.doc()
    assert response.completed is True and doc.run_status == "completed"
    assert doc.flow.steps[1].state["booking"]["hotel"] == "Hampton Inn Sherwood Portland"


async def test_compare_history_is_erased_on_every_entry() -> None:
    session = Session(
        [
            _call("capture_choices", {"criteria": {**SUITES, "room_type": "two beds"}}),
            _reply("1-9 listed"),
            _call("go_compare", {"hotels": ["1", "2"]}),
            _call("generate_comparison", {"hotels": ["1", "2"], "feature": "distance"}),
            _call("resume_booking", {}),
            _reply("1-9 listed again"),
            _call("go_compare", {"hotels": ["3", "4"]}),
            _call("generate_comparison", {"hotels": ["3", "4"], "feature": "room type"}),
        ]
    )
    await session.say("search")
    first = await session.say("compare 1 and 2 on distance")
    header = first.message.splitlines()[0]
    assert header.startswith("| Feature") and "Hampton Inn & Suites Portland Tigard" in header
    assert "Hampton Inn Portland-Airport" in header
    await session.say("back to the list")
    second = await session.say("compare 3 and 4 on room type")
    doc = await session.doc()
    messages = doc.flow.memory["CompareStep"].messages
    assert [m.type for m in messages] == ["system", "human", "ai", "tool", "ai"]
    assert messages[1].content == "compare 3 and 4 on room type"
    assert messages[-1].content == second.message and "| suite    | ✅" in second.message


# -- the scripted conversation through the Lambda handler on moto DynamoDB -------------------------


class Turn:
    """What one turn returned and what the session looked like after it."""

    def __init__(self, status: int, body: dict[str, Any], doc: Any, calls: list[list[Any]]) -> None:
        self.status, self.body, self.doc, self.calls = status, body, doc, calls
        self.json = doc.to_json_dict()

    def state(self, step: str) -> dict[str, Any]:
        return next(s.state for s in self.doc.flow.steps if s.name == step)

    def messages(self, namespace: str) -> list[Any]:
        return self.doc.flow.memory[namespace].messages


def converse(
    table: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replies: list[dict[str, Any]], **env: str
) -> tuple[list[Turn], aws_runtime.Runtime]:
    """The bundled conversation's turns through the Lambda handler, the model answering ``replies``.

    ``env`` adds to the environment (e.g. where HotelFlow's search server is); the caller stops the runtime.
    """
    script = tmp_path / "hotel-script.json"
    script.write_text(json.dumps(replies))
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", table.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", "flows.hotel")
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "HOTEL_FLOW_CURRENT_DATE",
                 "HOTEL_MCP_URL", "HOTEL_MCP_COMMAND"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    runtime = aws_runtime.get_runtime()
    provider = runtime.engine.providers.override
    results: list[Turn] = []
    session = None
    for turn in CONVERSATION["turns"]:
        body = {"flowName": CONVERSATION["flow"], "message": turn["user"], "config": CONVERSATION["config"]}
        event = http_event("POST", "/ai/run", body=body, headers={"CHAT_SESSION_ID": session} if session else None)
        result = api.lambda_handler(event, FakeLambdaContext(timeout_ms=25_000))
        payload = json.loads(result["body"])
        session = payload["session"]
        doc = runtime.call(runtime.engine.session_store.load(session))
        results.append(Turn(result["statusCode"], payload, doc, list(provider.calls)))
    return results, runtime


def scripted_replies() -> list[dict[str, Any]]:
    return [reply for turn in CONVERSATION["turns"] for reply in turn["replies"]]


@pytest.fixture
def turns(moto_dynamodb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Turn]]:
    results, runtime = converse(moto_dynamodb, tmp_path, monkeypatch, scripted_replies())
    yield results
    runtime.loop.call_soon_threadsafe(runtime.loop.stop)


PRICE_TABLE = """\
| Feature   | Hampton Inn Portland-Airport | Hampton Inn Portland/Clackamas | Hampton Inn Portland East |
| --------- | ---------------------------- | ------------------------------ | ------------------------- |
| Wed 07/01 | $383.04                      | $331.20                        | $342.72                   |
| Thu 07/02 | $383.04                      | $331.20                        | $342.72                   |
| Fri 07/03 | $383.04                      | $331.20                        | $342.72                   |
| Sat 07/04 | $528.60                      | $457.06                        | $472.95                   |
| Sun 07/05 | $440.50                      | $380.88                        | $394.13                   |
| Total     | $2,118.21                    | $1,831.54                      | $1,895.24                 |

Another comparison, or ready to book?"""
COMPARED = ["Hampton Inn Portland-Airport", "Hampton Inn Portland/Clackamas", "Hampton Inn Portland East"]


def _system_text(call: list[Any]) -> str:
    return "\n".join(m.content for m in call if isinstance(m, SystemMessage))


def test_conversation_every_turn_uses_exactly_its_scripted_replies(turns: list[Turn]) -> None:
    ends = list(accumulate(len(turn["replies"]) for turn in CONVERSATION["turns"]))
    assert [len(turn.calls) for turn in turns] == ends
    for turn in turns:
        assert turn.status == 200 and turn.body["success"] is True
        assert turn.body["contentType"] == "text/plain"
    assert [turn.body["completed"] for turn in turns] == [False] * 13 + [True]
    assert [turn.doc.flow.current_step for turn in turns] == ["ExploreStep"] * 7 + [
        "PresentStep",
        "PresentStep",
        "CompareStep",
        "CompareStep",
        "CompareStep",
        "PresentStep",
        "TerminateSessionStep",
    ]


def test_conversation_criteria_are_owned_by_explore_and_results_stay_transient(turns: list[Turn]) -> None:
    searched = turns[7]
    assert searched.state("ExploreStep")["criteria"] == {
        **SUITES,
        "min_price": None,
        "max_airport_miles": None,
        "max_city_center_miles": None,
    }
    assert turns[8].state("ExploreStep")["criteria"]["room_type"] == "two beds"
    for turn in turns:
        for step in turn.json["flow"]["steps"]:
            assert "_transient" not in step["state"] and "hotels" not in step["state"]
    # The results reached the presentation prompt even though they were never stored.
    assert "1. Hilton Garden Inn Beaverton - total $2,538.27" in _system_text(searched.calls[-2])
    assert "9. Hilton Garden Inn Wilsonville Portland - total $1,943.02" in _system_text(turns[8].calls[-2])


def test_conversation_compacts_the_explore_history(turns: list[Turn]) -> None:
    scripted = [turn["replies"] for turn in CONVERSATION["turns"]]
    sizes = [len(turn.messages("hotel-explore")) for turn in turns]
    # System slot included: a history that reaches 8 messages is compacted, after turns 3, 5, 7, 8 and 9.
    assert sizes[:9] == [4, 6, 5, 7, 5, 7, 5, 5, 6]
    assert max(sizes) <= 7
    for index in (2, 4, 6, 7, 8):
        space = turns[index].doc.flow.memory["hotel-explore"]
        assert space.summary == scripted[index][-1]["content"]
        assert space.summarized_through_id
    # The next explore call carries the summary as a second system message, right after the prompt.
    first_after = turns[3].calls[-1]
    assert isinstance(first_after[1], SystemMessage)
    assert first_after[1].content == f"{SUMMARY_MESSAGE_PREFIX}\n{scripted[2][-1]['content']}"
    # The summary model saw the older messages, not the whole raw history.
    summary_request = turns[2].calls[-1]
    assert "User: Hi" in summary_request[-1].content and "7/1/2026" not in summary_request[-1].content


def test_conversation_forwards_the_users_words_across_steps(turns: list[Turn]) -> None:
    explore_call = turns[8].calls[-3]
    # The last message of a request is the step's turn notes; the stored history ends before them.
    forwarded = explore_call[-2]
    assert '"room_type": "suite"' in explore_call[-1].content
    assert isinstance(forwarded, HumanMessage) and forwarded.content == "change to two beds and search again"
    assert message_step(forwarded) == "ExploreStep"
    compare_call = turns[9].calls[-1]
    assert compare_call[-2].content == "compare 2,5,7 on price." and message_step(compare_call[-2]) == "CompareStep"


def test_conversation_erases_present_and_compare_history_on_entry(turns: list[Turn]) -> None:
    for index in (7, 8, 12):
        system, opener, listing = turns[index].messages("PresentStep")
        assert system.type == "system" and opener.type == "human" and listing.type == "ai"
        assert opener.content == "Which hotels can I choose from?"
    first_compare = turns[9].messages("CompareStep")
    assert [m.type for m in first_compare] == ["system", "human", "ai", "tool", "ai"]
    # Comparisons within one visit accumulate; direct() does not re-enter the step.
    assert len(turns[10].messages("CompareStep")) == 9


def test_conversation_comparisons_are_returned_directly(turns: list[Turn]) -> None:
    assert turns[9].body["message"] == PRICE_TABLE
    assert turns[9].state("CompareStep")["selected"] == COMPARED
    last = turns[9].messages("CompareStep")[-1]
    assert last.type == "ai" and last.additional_kwargs == {"direct": True} and last.content == PRICE_TABLE

    amenities = turns[10].body["message"]
    assert amenities.startswith(f"| Feature         | {' | '.join(COMPARED)} |")
    assert "| indoorPool      | ❌                            | ✅ " in amenities
    # The bundled server reports every amenity, so the table is the catalog's, with nothing unknown.
    records = [catalog.hotel(name) for name in COMPARED]
    offered = sorted({name for record in records for name, on in record["amenities"].items() if on})
    rows = [[name, *(chart.YES if record["amenities"].get(name) else chart.NO for record in records)]
            for name in offered]
    assert amenities == f"{chart.table(['Feature', *COMPARED], rows)}\n\nAnother comparison, or ready to book?"

    refused = turns[11].messages("CompareStep")[-2]
    assert refused.type == "tool" and refused.content.startswith("'guest ratings' cannot be compared")
    assert turns[11].body["message"] == CONVERSATION["turns"][11]["replies"][-1]["content"]


def test_conversation_books_and_terminates(turns: list[Turn]) -> None:
    final = turns[-1]
    session = final.body["session"]
    booked = final.state("PresentStep")["booking"]
    number = booking.confirmation_number(session, "Hilton Garden Inn Wilsonville Portland")
    assert booked == {
        "hotel": "Hilton Garden Inn Wilsonville Portland",
        "confirmation": number,
        "room_type": "two beds",
        "start": "2026-07-01",
        "end": "2026-07-06",
        "total": 1943.02,
    }
    assert f"Confirmation number: {number}" in final.body["message"]
    assert final.doc.run_status == "completed"
    assert [item.step_name for item in final.doc.flow.sequence] == [
        "ExploreStep",
        "PresentStep",
        "ExploreStep",
        "PresentStep",
        "CompareStep",
        "PresentStep",
        "TerminateSessionStep",
    ]
    assert {item.level for item in final.doc.flow.sequence} == {1}


def test_conversation_tallies_every_scripted_token(turns: list[Turn]) -> None:
    replies = [reply for turn in CONVERSATION["turns"] for reply in turn["replies"]]
    tokens = turns[-1].doc.tokens
    assert tokens.input_tokens == sum(r["usage"]["input_tokens"] for r in replies) > 0
    assert tokens.output_tokens == sum(r["usage"]["output_tokens"] for r in replies) > 0
    assert tokens.total_tokens == tokens.input_tokens + tokens.output_tokens


# -- another search server ---------------------------------------------------------------------------


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_renamed(item, names) for item in value]
    if isinstance(value, dict):
        return {key: _renamed(item, names) for key, item in value.items()}
    return value


def _other_server_hotels(room_type: str) -> list[tuple[str, float]]:
    """What the other server answers the conversation's searches with (called in process, for the expectations)."""
    from tests.support import other_hotel_server as other

    found = other.search_hotels("2026-07-01", "2026-07-06", ["freeWiFi", "freeParking"], [room_type],
                                other.Budget(max=700), other.MaxDistanceMiles())
    return [(hotel.hotelName, hotel.total) for hotel in found.hotels]


def _shape(turn: Turn) -> tuple[Any, ...]:
    """Everything of a turn but the hotels: status, outcome, step, model calls, each step's message kinds."""
    memory = {name: [m.type for m in space.messages] for name, space in turn.doc.flow.memory.items()}
    steps = [(item.step_name, item.level) for item in turn.doc.flow.sequence]
    return (turn.status, turn.body["success"], turn.body["completed"], turn.body["contentType"],
            turn.doc.flow.current_step, turn.doc.run_status, len(turn.calls), memory, steps)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_another_search_server_changes_the_hotels_presented_and_nothing_else(
    transport: str, turns: list[Turn], moto_dynamodb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suites, two_beds = _other_server_hotels("suite"), _other_server_hotels("two beds")
    bundled_two_beds = [entry["hotel"] for entry in bundled({**SUITES, "room_type": "two beds"})]
    assert not {name for name, _ in suites + two_beds} & {hotel["name"] for hotel in catalog.hotels()}
    # The model names hotels from the list it was shown: the same positions of the other server's list.
    replies = _renamed(scripted_replies(), dict(zip(bundled_two_beds, [name for name, _ in two_beds], strict=False)))

    server = None
    if transport == "http":
        server = HttpServer("tests.support.other_hotel_server", tmp_path / "other-hotels.log").start()
        env = {"HOTEL_MCP_URL": server.url}
    else:
        env = {"HOTEL_MCP_COMMAND": f"{sys.executable} -m tests.support.other_hotel_server"}
    (tmp_path / "other").mkdir()
    try:
        other, runtime = converse(moto_dynamodb, tmp_path / "other", monkeypatch, replies, **env)
        runtime.loop.call_soon_threadsafe(runtime.loop.stop)
    finally:
        if server is not None:
            server.stop()

    # Nothing but the hotels changed: every turn's outcome, step, model calls and memory have the same shape.
    assert [_shape(turn) for turn in other] == [_shape(turn) for turn in turns]
    assert all(turn.status == 200 and turn.body["success"] for turn in other)

    # The hotels HotelFlow presented, compared and booked are the other server's.
    listed = "\n".join(f"{n}. {name} - total {chart.money(total)}" for n, (name, total) in enumerate(suites, 1))
    assert f"Search results (number. hotel - total price for the stay):\n{listed}\n" in _system_text(other[7].calls[-2])
    listed = "\n".join(f"{n}. {name} - total {chart.money(total)}" for n, (name, total) in enumerate(two_beds, 1))
    assert listed in _system_text(other[8].calls[-2])
    compared = [two_beds[1][0], two_beds[4][0], two_beds[6][0]]
    assert other[9].state("CompareStep")["selected"] == compared
    assert other[9].body["message"].startswith(f"| Feature   | {' | '.join(compared)} |")
    assert "| Total     | $621.92" in other[9].body["message"]
    # The original contract says nothing of amenities: the searched ones are known, the table says the rest is not.
    amenities = other[10].body["message"]
    assert "| freeParking | ✅" in amenities and "| freeWiFi    | ✅" in amenities
    assert f"did not report the amenities of {', '.join(compared)}" in amenities
    booked = other[-1].state("PresentStep")["booking"]
    bundled_booking = turns[-1].state("PresentStep")["booking"]
    assert booked == {**bundled_booking, "hotel": two_beds[8][0], "total": two_beds[8][1],
                        "confirmation": booking.confirmation_number(other[-1].body["session"], two_beds[8][0])}
    produced = "\n".join(
        [_system_text(call) for turn in other for call in turn.calls]
        + [turn.body["message"] for turn in other[9:11]] + [other[-1].body["message"]]
    )
    assert not [hotel["name"] for hotel in catalog.hotels() if hotel["name"] in produced]


# -- a search server's price list of the wrong length ---------------------------------------------------------


def _presented(calls: list[Any]) -> dict[str, str]:
    """Hotel -> total as PresentStep's prompt lists them."""
    text = _system_text(calls)
    listing = text.split("Search results (number. hotel - total price for the stay):\n", 1)[1]
    return dict(line.split(". ", 1)[1].rsplit(" - total ", 1) for line in listing.splitlines() if " - total " in line)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_pricing_the_check_out_day_too_is_charged_for_the_nights_only(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the original's server does: one price per day from check-in to check-out, both included, all in its total.
    monkeypatch.setenv("OTHER_HOTEL_DAYS_PRICED", "with-check-out")
    server = None
    if transport == "http":
        server = HttpServer("tests.support.other_hotel_server", tmp_path / "other.log",
                            env={"OTHER_HOTEL_DAYS_PRICED": "with-check-out"}).start()
        monkeypatch.setenv("HOTEL_MCP_URL", server.url)
    else:
        monkeypatch.delenv("HOTEL_MCP_URL", raising=False)
        monkeypatch.setenv("HOTEL_MCP_COMMAND", f"{sys.executable} -m tests.support.other_hotel_server")
        # A stdio server gets only the variables it is given: this one is passed through by name.
        monkeypatch.setenv("HOTEL_MCP_INHERIT_ENV", "OTHER_HOTEL_DAYS_PRICED")
    session = Session([_call("capture_choices", {"criteria": SUITES}), _reply("Here they are."),
                       _call("chosen_hotel", {"hotel": "1"})])
    try:
        await session.say("suite, 7/1 to 7/6, search")
        presented = _presented(session.provider.calls[-1])
        response = await session.say("book the first")
    finally:
        await session.engine.close()
        if server is not None:
            server.stop()

    monkeypatch.delenv("OTHER_HOTEL_DAYS_PRICED")
    nights_only = {name: chart.money(total) for name, total in _other_server_hotels("suite")}
    assert len(presented) >= 2 and presented == {name: nights_only[name] for name in presented}
    first = next(iter(presented))
    booked = (await session.doc()).flow.steps[1].state["booking"]
    assert response.completed and booked["hotel"] == first
    assert chart.money(booked["total"]) == nights_only[first]


def test_a_price_list_is_matched_to_the_nights_of_the_stay() -> None:
    assert booking.nightly_prices([100.0, 110.0], 2) == [100.0, 110.0]
    assert booking.nightly_prices([100.0, 110.0, 120.0], 2) == [100.0, 110.0]
    assert booking.nightly_prices([100.0], 2) is None
    assert booking.nightly_prices([100.0] * 4, 2) is None


async def test_hotels_priced_for_too_few_days_are_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTHER_HOTEL_DAYS_PRICED", "one-short")
    monkeypatch.delenv("HOTEL_MCP_URL", raising=False)
    monkeypatch.setenv("HOTEL_MCP_COMMAND", f"{sys.executable} -m tests.support.other_hotel_server")
    monkeypatch.setenv("HOTEL_MCP_INHERIT_ENV", "OTHER_HOTEL_DAYS_PRICED")
    session = Session([_call("capture_choices", {"criteria": SUITES}), _reply("Nothing fits.")])
    try:
        await session.say("suite, 7/1 to 7/6, search")
    finally:
        await session.engine.close()
    doc = await session.doc()
    assert doc.flow.current_step == "ExploreStep"
    assert _tool_results(doc, "hotel-explore")[-1].startswith("No hotel matches")
    left_out = [entry for entry in doc.warn if entry.message.startswith("hotel left out")]
    assert left_out and left_out[0].model_dump()["prices"] == 4
