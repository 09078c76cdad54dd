"""HomeInsuranceQuoteFlow end to end: the scripted conversation through the Lambda handler on moto DynamoDB,
idle expiry, the referral path, the presentation fallback and the deterministic rating rules."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import handlers.api as api
import picoflow.session.document as store_module
from flows.home_insurance import INTAKE_MEMORY, HomeInsuranceQuoteFlow, presenter
from flows.home_insurance.rating import QuoteConfig, load_quote_config, quote
from flows.home_insurance.steps import CONTACT_OPENER, REFERRAL_OPENER, REVIEW_OPENER
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.conversation.compaction import build_summary_request
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import DynamoDBSessionStore, SessionDoc
from tests.support.engine import call, scripted_engine, text

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

FLOW = "HomeInsuranceQuoteFlow"
CONVERSATION = json.loads(
    (Path(__file__).resolve().parents[1] / "flows" / "home_insurance" / "conversation.json").read_text()
)
TURNS: list[dict[str, Any]] = CONVERSATION["turns"]
CONFIG: dict[str, Any] = CONVERSATION["config"]
RATED_AT = datetime(2027, 7, 15, tzinfo=UTC)
SUMMARY_INSTRUCTION = build_summary_request([], None)[0].content
NEW_SESSION_GREETING = "Hello! Let's start a new quote."
OWNERS = {
    "qualification": "QualificationStep",
    "property": "PropertyStep",
    "risk": "RiskStep",
    "coverage": "CoverageStep",
}
ISOLATED = {
    "home-quote-coverage": "CoverageStep",
    "home-quote-review": "ReviewStep",
    "home-quote-options": "PresentQuoteStep",
    "home-quote-contact": "ContactStep",
    "home-quote-terminal": "TerminateSessionStep",
}


def replies(*turns: int) -> list[dict[str, Any]]:
    """The scripted replies of the given 1-based conversation turns, in order."""
    return [reply for number in turns for reply in TURNS[number - 1]["replies"]]


class Client:
    """Drives the real Lambda handler with API Gateway v2 events and reads the stored documents."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.store = DynamoDBSessionStore(table.name, client=table.client)

    def run(self, message: str, session: str | None = None) -> tuple[int, dict[str, str], Any]:
        body = {"flowName": FLOW, "message": message, "config": CONFIG}
        event = http_event("POST", "/ai/run", body=body, headers={"CHAT_SESSION_ID": session} if session else None)
        result = api.lambda_handler(event, FakeLambdaContext())
        headers = {name.lower(): value for name, value in result.get("headers", {}).items()}
        raw = result.get("body") or ""
        return result["statusCode"], headers, json.loads(raw) if headers["content-type"] == "application/json" else raw

    def load(self, session: str) -> SessionDoc:
        doc = asyncio.run(self.store.load(session))
        assert doc is not None
        return doc

    def age(self, session: str, minutes: int, monkeypatch: pytest.MonkeyPatch) -> None:
        """Rewrite a stored session through the store as if its last save was ``minutes`` ago."""
        doc = self.load(session)
        with monkeypatch.context() as patch:
            patch.setattr(store_module, "utc_now", lambda: datetime.now(UTC) - timedelta(minutes=minutes))
            asyncio.run(self.store.save(doc, doc.revision))

    @property
    def provider(self) -> ScriptedProvider:
        return aws_runtime._runtime.engine.providers.override

    def count(self) -> int:
        return len(self.table.client.scan(TableName=self.table.name, ConsistentRead=True)["Items"])


@pytest.fixture
def handler(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Any]:
    """A factory: ``handler(script)`` points the Lambda handler at moto DynamoDB and a scripted model."""

    def build(script: list[dict[str, Any]]) -> Client:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(script))
        monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
        monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
        monkeypatch.setenv("PICOFLOW_FLOWS", "flows.home_insurance")
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        return Client(moto_dynamodb)

    yield build
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def state(doc: SessionDoc, step: str, key: str | None = None) -> Any:
    (found,) = [s.state for s in doc.flow.steps if s.name == step]
    return found if key is None else found.get(key)


def authors(doc: SessionDoc, namespace: str) -> set[str]:
    """The steps the non-system messages of a namespace are attributed to (by message id)."""
    return {m.id.split("|", 1)[0] for m in doc.flow.memory[namespace].messages[1:]}


def contents(doc: SessionDoc, namespace: str) -> list[Any]:
    return [m.content for m in doc.flow.memory[namespace].messages[1:]]


def quote_of(doc: SessionDoc) -> Any:
    return state(doc, "RateQuoteStep", "quoteResult")


# -- the scripted conversation through the Lambda handler ---------------------------------------------


def test_scripted_conversation_end_to_end(handler):
    client = handler([*replies(*range(1, len(TURNS) + 1)), text(NEW_SESSION_GREETING)])
    session: str | None = None
    docs: dict[int, SessionDoc] = {}
    bodies: dict[int, Any] = {}
    used = 0
    for number, turn in enumerate(TURNS, start=1):
        status, headers, body = client.run(turn["user"], session)
        assert status == 200, body
        session = session or headers["chat_session_id"]
        assert headers["chat_session_id"] == session
        used += len(turn["replies"])
        # Each turn makes exactly as many model calls as the script gives it.
        assert len(client.provider.calls) == used, f"turn {number}"
        docs[number], bodies[number] = client.load(session), body

    # Turn 1: a new session opens on QualificationStep, in the shared intake namespace.
    assert docs[1].flow.current_step == "QualificationStep"
    assert set(docs[1].flow.memory) == {INTAKE_MEMORY}
    assert bodies[1]["success"] is True and bodies[1]["completed"] is False

    # Turn 2: qualification is saved on its owner under the record's own keys.
    assert docs[2].flow.current_step == "PropertyStep"
    assert state(docs[2], "QualificationStep", "qualification") == {
        "state": "OR", "zip": "97205", "purchaseStatus": "own", "occupancy": "primary", "effectiveDate": "2027-09-01",
    }
    assert authors(docs[2], INTAKE_MEMORY) == {"QualificationStep", "PropertyStep"}

    # Turn 3: the intake namespace reaches 12 messages and is compacted to a summary plus the newest 6.
    intake = docs[3].flow.memory[INTAKE_MEMORY]
    assert intake.summary == TURNS[2]["replies"][-1]["content"]
    assert len(intake.messages) == 1 + 6
    assert state(docs[3], "PropertyStep", "property")["roofAgeYears"] == 6
    assert client.provider.calls[len(replies(1, 2, 3)) - 1][0].content == SUMMARY_INSTRUCTION

    # Turn 5: risk saved; a second, rolling summary.
    assert docs[5].flow.current_step == "CoverageStep"
    assert state(docs[5], "RiskStep", "risk")["hazards"] == {"pool": False, "trampoline": False, "woodStove": True}
    intake = docs[5].flow.memory[INTAKE_MEMORY]
    assert intake.summary == TURNS[4]["replies"][-1]["content"]
    second_summary = client.provider.calls[len(replies(*range(1, 6))) - 1]
    assert TURNS[2]["replies"][-1]["content"] in second_summary[1].content

    # Turn 6: coverage saved, review opens with the code's cue in its own namespace.
    assert docs[6].flow.current_step == "ReviewStep"
    assert state(docs[6], "CoverageStep", "coverage")["deductible"] == 2500
    assert contents(docs[6], "home-quote-review")[0] == REVIEW_OPENER

    # Turn 7: a roof correction goes to PropertyStep (the owner) with the customer's words, then back to review.
    seventh = docs[7]
    assert seventh.flow.current_step == "ReviewStep"
    assert state(seventh, "PropertyStep", "property")["roofAgeYears"] == 4
    assert state(seventh, "PropertyStep", "correctionMode") is None
    assert TURNS[6]["user"] in contents(seventh, INTAKE_MEMORY)
    assert contents(seventh, "home-quote-review")[0] == REVIEW_OPENER  # the old review was erased

    # Turn 8: confirmation -> rating without a model -> the exact table, returned verbatim as Markdown.
    eighth = docs[8]
    first_quote = quote_of(eighth)
    parts = {part: state(eighth, owner, part) for part, owner in OWNERS.items()}
    assert first_quote == quote(parts, RATED_AT)
    assert first_quote["decision"] == "eligible" and first_quote["quoteId"].startswith("EHI-20270715-")
    assert bodies[8] == presenter.options(first_quote)
    assert state(eighth, "PresentQuoteStep", "presentedQuoteId") == first_quote["quoteId"]
    assert state(eighth, "PresentQuoteStep", "needsPresentation") is None
    assert [s.model for s in eighth.flow.steps if s.name == "RateQuoteStep"] == [None]

    # Turn 9: a comparison is a direct table too, in the order asked for.
    assert bodies[9] == presenter.comparison(first_quote["options"][:2])

    # Turn 10: a deductible change is written to CoverageStep and re-rated: a new id, lower premiums.
    tenth = docs[10]
    second_quote = quote_of(tenth)
    assert state(tenth, "CoverageStep", "coverage")["deductible"] == 5000
    assert second_quote["quoteId"] != first_quote["quoteId"]
    assert all(new["annualPremium"] < old["annualPremium"]
               for new, old in zip(second_quote["options"], first_quote["options"], strict=True))
    assert bodies[10] == presenter.options(second_quote)
    assert TURNS[8]["user"] not in contents(tenth, "home-quote-options")  # erased on re-entry

    # Turns 11-12: Enhanced of the current quote, explicit consent, completion through the terminal step.
    assert state(docs[11], "PresentQuoteStep", "selectedOption") == second_quote["options"][1]
    assert contents(docs[11], "home-quote-contact")[0] == CONTACT_OPENER
    final = docs[12]
    assert bodies[12]["completed"] is True and final.run_status == "completed"
    assert bodies[12]["message"] == TURNS[11]["replies"][-1]["content"]
    assert state(final, "ContactStep", "contact") == {
        "consentToContact": True, "name": "Jordan Rivera", "email": "jordan.rivera@example.com",
        "phone": None, "propertyAddress": None,
    }
    closing = state(final, "TerminateSessionStep", "_prompt")
    assert second_quote["quoteId"] in closing and "Enhanced (ENHANCED)" in closing

    for namespace, owner in ISOLATED.items():
        assert authors(final, namespace) == {owner}, namespace
    assert [item.step_name for item in final.flow.sequence] == [
        "QualificationStep", "PropertyStep", "RiskStep", "CoverageStep", "ReviewStep", "PropertyStep",
        "ReviewStep", "RateQuoteStep", "PresentQuoteStep", "RateQuoteStep", "PresentQuoteStep", "ContactStep",
        "TerminateSessionStep",
    ]
    usage = [reply["usage"] for turn in TURNS for reply in turn["replies"]]
    inputs, outputs = sum(u["input_tokens"] for u in usage), sum(u["output_tokens"] for u in usage)
    assert (final.tokens.input_tokens, final.tokens.output_tokens) == (inputs, outputs)
    assert client.provider.remaining == 1
    # Every stage prompt was rendered completely (a missing value would leave its placeholder visible).
    assert not [c[0].content for c in client.provider.calls if re.search(r"\{\{[A-Z_]+\}\}", c[0].content)]
    assert final.revision == len(TURNS)

    # A completed session is not resumed: the next message starts a new one.
    status, headers, body = client.run("Hello again", session)
    assert status == 200 and body["message"] == NEW_SESSION_GREETING
    assert headers["chat_session_id"] != session


# -- idle expiry ------------------------------------------------------------------------------------------


def test_idle_session_restarts_and_recent_one_is_restored(handler, monkeypatch):
    opening = TURNS[0]["replies"][0]
    client = handler([opening, opening, text("A fresh start: which state is the home in?"), text("Which ZIP code?")])
    _, idle_headers, _ = client.run(TURNS[0]["user"])
    _, recent_headers, _ = client.run(TURNS[0]["user"])
    idle, recent = idle_headers["chat_session_id"], recent_headers["chat_session_id"]
    client.age(idle, 31, monkeypatch)
    client.age(recent, 29, monkeypatch)
    idle_before = client.load(idle)

    status, headers, body = client.run("I'm back, the home is in Ohio.", idle)
    assert status == 200 and body["success"] is True
    restarted = headers["chat_session_id"]
    assert restarted != idle
    # The declined document stays stored untouched; the new one starts from the first step.
    assert client.load(idle).to_json_dict() == idle_before.to_json_dict()
    fresh = client.load(restarted)
    assert fresh.flow.current_step == "QualificationStep" and fresh.revision == 1
    assert TURNS[0]["user"] not in contents(fresh, INTAKE_MEMORY)

    status, headers, body = client.run("It's in Ohio.", recent)
    assert status == 200 and headers["chat_session_id"] == recent
    assert body["message"] == "Which ZIP code?"
    resumed = client.load(recent)
    assert resumed.revision == 3  # created, first turn, aged rewrite, this turn
    assert {TURNS[0]["user"], "It's in Ohio."} <= set(contents(resumed, INTAKE_MEMORY))
    assert client.count() == 3


# -- paths driven on FlowEngine directly ------------------------------------------------------------------


async def _drive(engine: Any, messages: list[str], session: str | None = None) -> tuple[str, list[Any]]:
    responses = []
    for message in messages:
        response = await engine.run(FLOW, message, session, CONFIG)
        assert response.success, response.message
        session = response.session
        responses.append(response)
    return session, responses


async def test_prose_instead_of_the_show_tool_still_gets_the_code_rendered_table():
    prose = text("Your Enhanced option is only about $800 a year!")
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow], [*replies(1, 2, 3, 4, 5, 6), TURNS[7]["replies"][0], prose]
    )
    session, responses = await _drive(engine, [turn["user"] for turn in TURNS[:6]] + [TURNS[7]["user"]])
    doc = await engine.session_store.load(session)
    assert responses[-1].message == presenter.options(quote_of(doc))
    assert responses[-1].content_type == presenter.MARKDOWN
    assert state(doc, "PresentQuoteStep", "needsPresentation") is None
    assert "$800" not in json.dumps(doc.flow.memory["home-quote-options"].model_dump(mode="json"))
    assert provider.remaining == 0


async def test_an_unsupported_state_is_referred_by_code_and_ends():
    washington = {**TURNS[1]["replies"][0]["tool_calls"][0]["args"], "state": "wa", "zip": "98101"}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [
            *replies(1),
            call(("capture_home_qualification", washington)),
            call(("finish_home_quote_referral", {"acknowledged": True})),
            text("Thank you. An agent would need to review it; nothing was bound and no payment taken."),
        ],
    )
    session, responses = await _drive(engine, [TURNS[0]["user"], "Seattle, WA 98101; I own it; primary; from Sept 1."])
    doc = await engine.session_store.load(session)
    steps = [item.step_name for item in doc.flow.sequence]
    assert steps == ["QualificationStep", "ReferralStep", "TerminateSessionStep"]
    assert state(doc, "QualificationStep", "qualification")["state"] == "WA"  # upper-cased by the record
    assert state(doc, "ReferralStep", "decision") == "unsupported"
    assert state(doc, "ReferralStep", "reasonCodes") == ["UNSUPPORTED_STATE"]
    assert state(doc, "RateQuoteStep", "quoteResult") is None  # nothing was rated
    assert contents(doc, "home-quote-referral")[0] == REFERRAL_OPENER
    assert '["UNSUPPORTED_STATE"]' in provider.calls[2][0].content  # the codes reached the prompt from code
    assert responses[-1].completed is True and doc.run_status == "completed"


async def test_an_effective_date_outside_the_next_year_is_refused_with_feedback():
    late = {**TURNS[1]["replies"][0]["tool_calls"][0]["args"], "effectiveDate": "2028-07-16"}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [*replies(1), call(("capture_home_qualification", late)), text("That is too far out; which date instead?")],
    )
    session, _ = await _drive(engine, [TURNS[0]["user"], "Portland 97205, owned, primary, from July 16, 2028."])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "QualificationStep"
    assert state(doc, "QualificationStep", "qualification") is None
    tool_result = provider.calls[-1][-2]  # the last message is the step's turn notes
    assert tool_result.type == "tool" and "after 2027-07-15 and no more than one year later" in tool_result.content


async def test_an_update_year_before_the_home_was_built_is_refused():
    early = {**TURNS[2]["replies"][0]["tool_calls"][0]["args"], "hvacUpdatedYear": 1990}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [*replies(1, 2), call(("capture_home_property", early)), text("Could you check the HVAC year?"),
         {"for": "summary", "content": "Asked to check the HVAC year."}],
    )
    session, _ = await _drive(engine, [turn["user"] for turn in TURNS[:2]] + ["HVAC done in 1990."])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "PropertyStep" and state(doc, "PropertyStep", "property") is None
    assert provider.calls[-2][-2].content == "The HVAC update year must be between the year built and 2027, or null."


async def test_selecting_an_option_that_is_not_in_the_quote_is_refused():
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [*replies(*range(1, 9)), call(("select_home_quote_option", {"optionId": "GOLD"})), text("Which one?")],
    )
    session, _ = await _drive(engine, [turn["user"] for turn in TURNS[:8]] + ["I'll take Gold."])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "PresentQuoteStep"
    assert state(doc, "PresentQuoteStep", "selectedOption") is None
    assert provider.calls[-1][-1].content == "Choose one current option ID: ESSENTIAL, ENHANCED, PREMIER."


async def test_declining_contact_keeps_no_details():
    engine, _ = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [
            *replies(*range(1, 12)),
            call(("capture_home_quote_contact", {"consentToContact": False, "name": "Jordan", "email": None,
                                                 "phone": "555-0100", "propertyAddress": None})),
            text("Understood; nothing was kept. No coverage is bound and no payment was taken."),
        ],
    )
    session, responses = await _drive(engine, [turn["user"] for turn in TURNS[:11]] + ["No thanks, no contact."])
    doc = await engine.session_store.load(session)
    assert responses[-1].completed is True
    assert state(doc, "ContactStep", "contact") == {
        "consentToContact": False, "name": None, "email": None, "phone": None, "propertyAddress": None,
    }


# -- the rating rules without any model --------------------------------------------------------------------


def test_the_rules_file_is_validated():
    raw = json.loads((Path(__file__).resolve().parents[1] / "flows/home_insurance/quote_config.json").read_text())
    assert load_quote_config().rulesVersion == raw["rulesVersion"] == "2027.1-demo"
    raw["protectionDiscounts"]["sprinklerSystem"] = 0.9
    with pytest.raises(ValueError, match="sprinklerSystem"):
        QuoteConfig.model_validate(raw)
