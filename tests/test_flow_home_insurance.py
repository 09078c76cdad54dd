"""HomeInsuranceQuoteFlow end to end: the scripted conversation through the Lambda handler on moto DynamoDB,
idle expiry, the referral path, the presentation fallback and the deterministic rating rules."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import handlers.api as api
import picoflow.session.document as store_module
from flows.home_insurance import INTAKE_MEMORY, HomeInsuranceQuoteFlow, presenter
from flows.home_insurance.rating import QuoteConfig, load_quote_config, quote_id, rate_application
from flows.home_insurance.records import QuoteApplication, QuoteResult
from flows.home_insurance.steps import CONTACT_OPENER, PRESENT_OPENER, REFERRAL_OPENER, REVIEW_OPENER
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.lifecycle import build_summary_request
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


def quote(doc: SessionDoc) -> QuoteResult:
    return QuoteResult.model_validate(state(doc, "RateQuoteStep", "quoteResult"))


def premium(result: QuoteResult, option_id: str) -> Any:
    option = result.option(option_id)
    assert option is not None
    return option.annual_premium


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
    first = docs[1]
    assert first.flow.current_step == "QualificationStep"
    assert set(first.flow.memory) == {INTAKE_MEMORY}
    assert bodies[1]["success"] is True and bodies[1]["completed"] is False
    assert bodies[1]["contentType"] == "text/plain"

    # Turn 2: qualification is saved on its owner; the property interview continues the same history.
    assert docs[2].flow.current_step == "PropertyStep"
    assert state(docs[2], "QualificationStep", "qualification") == {
        "state": "OH",
        "zip_code": "43215",
        "purchase_status": "owned",
        "occupancy": "primary",
        "effective_date": "2025-07-01",
    }
    assert authors(docs[2], INTAKE_MEMORY) == {"QualificationStep", "PropertyStep"}

    # Turn 3: the intake namespace reaches 12 messages (system slot included) and is compacted to a summary
    # plus the newest 6.
    third = docs[3]
    intake = third.flow.memory[INTAKE_MEMORY]
    assert intake.summary == TURNS[2]["replies"][-1]["content"]
    assert len(intake.messages) == 1 + 6
    assert intake.summarized_through_id.startswith("PropertyStep|")
    assert state(third, "PropertyStep", "property")["roof_age_years"] == 6
    summary_call = len(replies(1, 2, 3)) - 1
    assert client.provider.calls[summary_call][0].content == SUMMARY_INSTRUCTION

    # Turns 4-5: risk joins the same history; each interview step has no namespace of its own.
    assert docs[4].flow.current_step == "RiskStep"
    fifth = docs[5]
    assert fifth.flow.current_step == "CoverageStep"
    assert authors(docs[4], INTAKE_MEMORY) == {"PropertyStep", "RiskStep"}
    assert not {"QualificationStep", "PropertyStep", "RiskStep"} & set(fifth.flow.memory)
    assert state(fifth, "RiskStep", "risk") == {
        "claims_last_five_years": 0,
        "hazards": ["wood_stove"],
        "protections": ["monitored_alarm", "smoke_detectors"],
    }
    # Second compaction: a rolling summary built on the first one.
    intake = fifth.flow.memory[INTAKE_MEMORY]
    assert intake.summary == TURNS[4]["replies"][-1]["content"]
    assert len(intake.messages) == 1 + 6
    second_summary = client.provider.calls[len(replies(*range(1, 6))) - 1]
    assert second_summary[0].content == SUMMARY_INSTRUCTION
    assert TURNS[2]["replies"][-1]["content"] in second_summary[1].content

    # Turn 6: coverage saved, review opens with the code's cue in its own namespace.
    sixth = docs[6]
    assert sixth.flow.current_step == "ReviewStep"
    assert state(sixth, "CoverageStep", "coverage")["deductible"] == 2500
    assert contents(sixth, "home-quote-review")[0] == REVIEW_OPENER

    # Turn 7: confirmation -> deterministic rating -> the exact table, returned verbatim as Markdown.
    seventh = docs[7]
    first_quote = quote(seventh)
    assert seventh.flow.current_step == "PresentQuoteStep"
    assert first_quote.decision == "eligible" and first_quote.quote_id.startswith("HIQ-20250602-")
    assert bodies[7] == presenter.options(first_quote)
    assert state(seventh, "ReviewStep", "confirmedAt")
    assert state(seventh, "PresentQuoteStep", "presentedQuoteId") == first_quote.quote_id
    assert state(seventh, "PresentQuoteStep", "needsPresentation") is None
    parts = {part: state(seventh, owner, part) for part, owner in OWNERS.items()}
    expected = rate_application(QuoteApplication.model_validate(parts), date(2025, 6, 2))
    assert first_quote == expected
    # RateQuoteStep is a logic step: no model call was made for it, and it has no prompt or model override.
    assert [s.model for s in seventh.flow.steps if s.name == "RateQuoteStep"] == [None]

    # Turn 8: a comparison is a direct table too; no further model call.
    assert bodies[8] == presenter.comparison(
        [first_quote.option("ESSENTIAL"), first_quote.option("ENHANCED")], first_quote.quote_id
    )
    assert "How do Essential and Enhanced compare?" in contents(docs[8], "home-quote-options")

    # Turn 9: Enhanced is selected on the first quote and contact consent is asked.
    ninth = docs[9]
    assert ninth.flow.current_step == "ContactStep"
    assert state(ninth, "PresentQuoteStep", "selectedOption")["id"] == "ENHANCED"
    assert state(ninth, "PresentQuoteStep", "selectedOption")["annual_premium"] == str(premium(first_quote, "ENHANCED"))
    assert contents(ninth, "home-quote-contact")[0] == CONTACT_OPENER

    # Turn 10: a roof correction after rating goes to PropertyStep (the owner), then back to review.
    tenth = docs[10]
    assert tenth.flow.current_step == "ReviewStep"
    assert state(tenth, "PropertyStep", "property")["roof_age_years"] == 4
    assert state(tenth, "PropertyStep", "correctionMode") is None
    assert state(tenth, "ReviewStep", "confirmedAt") is None  # the changed application must be re-confirmed
    assert TURNS[9]["user"] in contents(tenth, INTAKE_MEMORY)  # the customer's words reached the owner
    # The stale selection is still stored until the new quote is presented.
    assert state(tenth, "PresentQuoteStep", "selectedOption")["id"] == "ENHANCED"
    # Below the threshold since the second compaction: the rolling summary is unchanged.
    intake = tenth.flow.memory[INTAKE_MEMORY]
    assert intake.summary == TURNS[4]["replies"][-1]["content"]
    assert len(intake.messages) < 12

    # Turn 11: re-confirmed and re-rated: a new quote id, the stale selection cleared, the old table erased.
    eleventh = docs[11]
    second_quote = quote(eleventh)
    assert eleventh.flow.current_step == "PresentQuoteStep"
    assert second_quote.quote_id != first_quote.quote_id
    assert premium(second_quote, "ENHANCED") < premium(first_quote, "ENHANCED")
    assert state(eleventh, "PresentQuoteStep", "presentedQuoteId") == second_quote.quote_id
    assert state(eleventh, "PresentQuoteStep", "selectedOption") is None
    assert bodies[11] == presenter.options(second_quote)
    options_history = contents(eleventh, "home-quote-options")
    assert options_history[0] == PRESENT_OPENER and options_history[-1] == bodies[11]
    assert len(options_history) == 4  # opener, show call, its result, the table: nothing from turns 7-9
    assert "How do Essential and Enhanced compare?" not in options_history

    # Turn 12: a deductible change is written to CoverageStep and re-rated through RateQuoteStep.
    twelfth = docs[12]
    third_quote = quote(twelfth)
    assert twelfth.flow.current_step == "PresentQuoteStep"
    assert state(twelfth, "CoverageStep", "coverage")["deductible"] == 5000
    assert third_quote.quote_id not in {first_quote.quote_id, second_quote.quote_id}
    assert {option.deductible for option in third_quote.options} == {5000}
    assert premium(third_quote, "ENHANCED") < premium(second_quote, "ENHANCED")
    assert state(twelfth, "PresentQuoteStep", "presentedQuoteId") == third_quote.quote_id
    assert bodies[12] == presenter.options(third_quote)
    assert TURNS[11]["user"] not in contents(twelfth, "home-quote-options")  # erased on re-entry

    # Turns 13-14: Enhanced of the current quote, explicit consent, completion through the terminal step.
    assert state(docs[13], "PresentQuoteStep", "selectedOption")["annual_premium"] == str(
        premium(third_quote, "ENHANCED")
    )
    final = docs[14]
    assert bodies[14]["completed"] is True and bodies[14]["success"] is True
    assert bodies[14]["message"] == TURNS[13]["replies"][-1]["content"]
    assert final.run_status == "completed"
    assert final.flow.current_step == "TerminateSessionStep"
    assert state(final, "ContactStep", "contact") == {
        "consent": True,
        "full_name": "Jordan Rivera",
        "email": "jordan.rivera@example.com",
        "phone": None,
        "street_address": None,
        "quote_id": third_quote.quote_id,
        "option_id": "ENHANCED",
    }
    assert "agreed to be contacted" in state(final, "TerminateSessionStep", "_prompt")

    # Isolated namespaces hold only their own step's messages; the intake one is shared.
    for namespace, owner in ISOLATED.items():
        assert authors(final, namespace) == {owner}, namespace
    assert final.flow.memory["home-quote-coverage"].summary is None

    assert [(item.level, item.step_name) for item in final.flow.sequence] == [
        (1, name)
        for name in (
            "QualificationStep",
            "PropertyStep",
            "RiskStep",
            "CoverageStep",
            "ReviewStep",
            "RateQuoteStep",
            "PresentQuoteStep",
            "ContactStep",
            "PropertyStep",
            "ReviewStep",
            "RateQuoteStep",
            "PresentQuoteStep",
            "RateQuoteStep",
            "PresentQuoteStep",
            "ContactStep",
            "TerminateSessionStep",
        )
    ]

    usage = [reply["usage"] for turn in TURNS for reply in turn["replies"]]
    inputs, outputs = sum(u["input_tokens"] for u in usage), sum(u["output_tokens"] for u in usage)
    assert final.tokens.model_dump() == {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
        "reasoning_tokens": 0,
        "visible_output_tokens": outputs,
        "cached_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    assert client.provider.remaining == 1
    # Every stage prompt was rendered completely (a missing value would leave its placeholder visible).
    assert not [c[0].content for c in client.provider.calls if re.search(r"\{[A-Z_]+\}", c[0].content)]
    assert final.revision == len(TURNS)

    # A completed session is not resumed: the next message starts a new one.
    status, headers, body = client.run("Hello again", session)
    assert status == 200 and body["message"] == NEW_SESSION_GREETING
    assert headers["chat_session_id"] != session
    assert client.load(session).run_status == "completed"


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
        [HomeInsuranceQuoteFlow], [*replies(1, 2, 3, 4, 5, 6), TURNS[6]["replies"][0], prose]
    )
    session, responses = await _drive(engine, [turn["user"] for turn in TURNS[:7]])
    doc = await engine.session_store.load(session)
    result = quote(doc)
    assert responses[-1].message == presenter.options(result)
    assert responses[-1].content_type == presenter.MARKDOWN
    assert state(doc, "PresentQuoteStep", "needsPresentation") is None
    assert "$800" not in json.dumps(doc.flow.memory["home-quote-options"].model_dump(mode="json"))
    assert provider.remaining == 0


async def test_unsupported_state_is_referred_with_code_owned_reasons_and_ends():
    nevada = {**TURNS[1]["replies"][0]["tool_calls"][0]["args"], "state": "NV", "zip_code": "89501"}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [
            *replies(1),
            call(("capture_home_qualification", nevada)),
            text("Online estimates are not available in Nevada yet; an agent can review your application."),
            call(("end_home_quote", {})),
            text("Thank you. Goodbye!"),
        ],
    )
    session, responses = await _drive(
        engine, [TURNS[0]["user"], "The home is in Reno, Nevada 89501; owned; primary; from July 1, 2025.", "OK, bye."]
    )
    doc = await engine.session_store.load(session)
    assert [item.step_name for item in doc.flow.sequence] == [
        "QualificationStep",
        "ReferralStep",
        "TerminateSessionStep",
    ]
    assert state(doc, "ReferralStep", "decision") == "unsupported"
    assert state(doc, "ReferralStep", "reasonCodes") == ["UNSUPPORTED_STATE"]
    assert state(doc, "RateQuoteStep", "quoteResult") is None  # nothing was priced
    assert contents(doc, "home-quote-referral")[0] == REFERRAL_OPENER
    assert "UNSUPPORTED_STATE" in provider.calls[2][0].content  # the reason reached the prompt from code
    assert responses[-1].completed is True and doc.run_status == "completed"


async def test_a_review_correction_goes_to_the_owner_and_returns_to_review():
    lower_deductible = {**TURNS[5]["replies"][0]["tool_calls"][0]["args"], "deductible": 1000}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [
            *replies(1, 2, 3, 4, 5, 6),
            call(("correct_home_application", {"section": "coverage", "change": "Use the $1,000 deductible."})),
            call(("capture_home_coverage", lower_deductible)),
            text("Updated: the deductible is now $1,000. Is everything correct?"),
        ],
    )
    correction = "Actually, make it the $1,000 deductible."
    session, _ = await _drive(engine, [turn["user"] for turn in TURNS[:6]] + [correction])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "ReviewStep"
    assert [item.step_name for item in doc.flow.sequence][-3:] == ["ReviewStep", "CoverageStep", "ReviewStep"]
    assert state(doc, "CoverageStep", "coverage")["deductible"] == 1000
    assert state(doc, "CoverageStep", "correctionMode") is None
    # The owner saw the request in its turn notes, after the customer's own words in its history.
    coverage_call = provider.calls[-2]
    assert "Use the $1,000 deductible." in coverage_call[-1].content
    assert coverage_call[-2].content == correction
    assert provider.remaining == 0


async def test_tool_feedback_keeps_invalid_or_stale_input_out_of_state():
    bad_date = {**TURNS[1]["replies"][0]["tool_calls"][0]["args"], "effective_date": "2025-05-01"}
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [
            *replies(1),
            call(("capture_home_qualification", bad_date)),
            text("That date has passed; when should cover start?"),
        ],
    )
    session, _ = await _drive(engine, [TURNS[0]["user"], "Ohio 43215, owned, primary, from May 1, 2025."])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "QualificationStep"
    assert state(doc, "QualificationStep", "qualification") is None
    tool_result = provider.calls[-1][-2]  # the last message is the step's turn notes
    assert tool_result.type == "tool" and "after 2025-06-02" in tool_result.content


async def test_selecting_an_option_of_another_quote_is_refused():
    engine, provider = scripted_engine(
        [HomeInsuranceQuoteFlow],
        [*replies(1, 2, 3, 4, 5, 6, 7), call(("select_home_quote_option", {"option_id": "GOLD"})), text("Which one?")],
    )
    session, _ = await _drive(engine, [turn["user"] for turn in TURNS[:7]] + ["I'll take Gold."])
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "PresentQuoteStep"
    assert state(doc, "PresentQuoteStep", "selectedOption") is None
    assert provider.calls[-1][-2].content == "Choose one current option id: ESSENTIAL, ENHANCED, PREMIER."
    assert provider.calls[-1][-1].content.endswith("Option chosen so far (null when none): null")


# -- the rating rules without any model --------------------------------------------------------------------


def _application_with(**changes: dict[str, Any]) -> QuoteApplication:
    base = {
        "qualification": TURNS[1]["replies"][0]["tool_calls"][0]["args"],
        "property": TURNS[2]["replies"][0]["tool_calls"][0]["args"],
        "risk": TURNS[4]["replies"][0]["tool_calls"][0]["args"],
        "coverage": TURNS[5]["replies"][0]["tool_calls"][0]["args"],
    }
    return QuoteApplication.model_validate({part: {**base[part], **changes.get(part, {})} for part in base})


TODAY = date(2025, 6, 2)


def test_rating_is_deterministic_and_input_derived():
    application = _application_with()
    first, again = rate_application(application, TODAY), rate_application(application.model_copy(deep=True), TODAY)
    assert first == again
    assert first.option_ids() == ["ESSENTIAL", "ENHANCED", "PREMIER"]
    assert first.valid_through == date(2025, 7, 2)
    assert [str(option.annual_premium) for option in first.options] == ["866.49", "894.31", "1002.60"]
    assert all(option.monthly_estimate == round(option.annual_premium / 12, 2) for option in first.options)
    # List order in the input does not matter; the rating date does.
    reordered = _application_with(risk={"protections": ["smoke_detectors", "monitored_alarm"]})
    assert quote_id(reordered, TODAY) == first.quote_id
    assert quote_id(application, TODAY + timedelta(days=1)) != first.quote_id


def test_a_higher_deductible_lowers_every_premium_and_changes_the_id():
    before = rate_application(_application_with(), TODAY)
    after = rate_application(_application_with(coverage={"deductible": 5000}), TODAY)
    assert after.quote_id != before.quote_id
    assert all(new.annual_premium < old.annual_premium for new, old in zip(after.options, before.options, strict=True))


@pytest.mark.parametrize(
    ("changes", "decision", "codes"),
    [
        ({"qualification": {"state": "NV"}}, "unsupported", ["UNSUPPORTED_STATE"]),
        ({"property": {"roof_age_years": 22}}, "referral", ["ROOF_AGE"]),
        ({"property": {"roof_material": "wood_shake"}}, "referral", ["ROOF_MATERIAL"]),
        ({"risk": {"claims_last_five_years": 3}}, "referral", ["CLAIMS_FREQUENCY"]),
        ({"coverage": {"dwelling_limit": 1_200_000}}, "referral", ["HIGH_DWELLING_LIMIT"]),
        (
            {"qualification": {"occupancy": "rental"}, "property": {"roof_age_years": 25}},
            "referral",
            ["RENTAL_OCCUPANCY", "ROOF_AGE"],
        ),
        (
            {"property": {"year_built": 1925, "systems_updated_year": None, "roof_age_years": 5}},
            "referral",
            ["DWELLING_AGE"],
        ),
        ({"property": {"year_built": 1925, "systems_updated_year": 2020, "roof_age_years": 5}}, "eligible", []),
    ],
)
def test_referrals_and_unsupported_states_carry_codes_and_no_premiums(changes, decision, codes):
    result = rate_application(_application_with(**changes), TODAY)
    assert result.decision == decision
    assert result.reason_codes == codes
    if decision != "eligible":
        assert result.options == [] and result.quote_id is None


def test_the_rules_file_is_validated_for_completeness():
    raw = json.loads((Path(__file__).resolve().parents[1] / "flows/home_insurance/quote_config.json").read_text())
    assert load_quote_config().rules_version == raw["rulesVersion"]
    del raw["stateFactors"]["OH"]
    with pytest.raises(ValueError, match="stateFactors"):
        QuoteConfig.model_validate(raw)
