"""SupportFlow (Northwind Outfitters): the scripted case, the return policy, billing disputes and the approval hold."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import picoflow.session.document as store_module
from flows.support import SupportFlow, orders, policy, receipt
from flows.support.steps import rma_id, ticket_id
from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.memory_store import MemorySessionStore
from tests.support.engine import call, text

CONVERSATION = json.loads((Path(__file__).resolve().parents[1] / "flows/support/conversation.json").read_text())
TURNS = CONVERSATION["turns"]
CONFIG = CONVERSATION["config"]
TODAY = date(2027, 7, 15)


def engine_with(script: list[dict[str, Any]], store: MemorySessionStore | None = None) -> tuple[FlowEngine, Any]:
    provider = ScriptedProvider(script)
    engine = FlowEngine([SupportFlow], store or MemorySessionStore(), ProviderRegistry(override=provider),
                        retry_delay=0)
    return engine, provider


async def converse(engine: FlowEngine, messages: list[str], session: str | None = None) -> list[Any]:
    answers = []
    for message in messages:
        response = await engine.run("SupportFlow", message, session, CONFIG)
        assert response.success, response.message
        session = response.session
        answers.append(response)
    return answers


def state(doc: Any, step: str) -> dict[str, Any]:
    return next(s.state for s in doc.flow.steps if s.name == step)


def replies(*numbers: int) -> list[dict[str, Any]]:
    return [reply for number in numbers for reply in TURNS[number - 1]["replies"]]


async def test_the_scripted_case_refunds_with_approval_opens_a_ticket_and_closes() -> None:
    engine, provider = engine_with(replies(*range(1, len(TURNS) + 1)))
    answers = await converse(engine, [turn["user"] for turn in TURNS])
    assert provider.remaining == 0
    assert [a.completed for a in answers] == [False] * (len(TURNS) - 1) + [True]
    doc = await engine.session_store.load(answers[-1].session)
    assert not [w.message for w in doc.warn]
    triage = state(doc, "TriageStep")
    assert triage["order"]["orderId"] == "NW-100517" and "postalCode" not in triage["order"]
    (refund,) = triage["refunds"]
    assert refund == {"rma": rma_id("NW-100517", ["L1"], "not_as_described"), "orderId": "NW-100517",
                      "lineIds": ["L1"], "netRefund": 364.65, "refundTarget": "Mastercard ending 7788",
                      "authority": "customer_confirmed"}
    (ticket,) = triage["tickets"]
    assert ticket["ticketId"] == ticket_id("NW-100517", ["CH-88422", "CH-88423"])
    assert (ticket["category"], ticket["customerImpact"]) == ("duplicate_charge", "high")
    assert ticket["amountInDispute"] == 858
    assert state(doc, "ReturnsStep")["returnedLineIds"] == ["L1"]
    assert "pending" not in state(doc, "ApprovalStep") and state(doc, "ApprovalStep")["decidedAt"]
    # The model said $429; the ledger said $858: the feedback names the corrected total.
    billing = [m.content for m in doc.flow.memory["support-billing"].messages if m.type == "tool"]
    assert "The disputed total was corrected to $858.00 from the order's charges." in billing
    closing = state(doc, "TerminateSessionStep")["_prompt"]
    assert f"{refund['rma']}: $364.65 refunded to Mastercard ending 7788." in closing
    assert f"Ticket {ticket['ticketId']} (duplicate_charge) is with the billing team." in closing
    assert [item.step_name for item in doc.flow.sequence] == [
        "TriageStep", "ReturnsStep", "AdjudicateStep", "ApprovalStep", "TriageStep", "BillingStep",
        "EscalateStep", "TriageStep", "TerminateSessionStep"]


async def test_a_failed_verification_reveals_nothing_and_counts() -> None:
    engine, provider = engine_with([call(("verify_order", {"orderId": "NW-100517", "secret": "00000"})),
                                    text("That does not match; please check both.")])
    (answer,) = await converse(engine, ["NW-100517, ZIP 00000"])
    doc = await engine.session_store.load(answer.session)
    assert state(doc, "TriageStep") == {"verifyAttempts": 1, "_saveOn": state(doc, "TriageStep")["_saveOn"]}
    assert provider.calls[-1][-1].content.startswith("That order number and email or ZIP code do not match.")
    assert orders.verify("nw-100517", " MARCUS.OYELARAN@example.com ") is not None
    assert orders.verify("NW-999999", "98109") is None


@pytest.mark.parametrize(("order_id", "lines", "reason", "decision", "net"), [
    ("NW-100412", ["L2"], "no_longer_needed", "auto", 136.0),
    ("NW-100412", ["L2"], "damaged", "auto", 150.95),  # shipping refunded for a damaged item
    ("NW-100412", ["L1"], "too_large", "review", 289.0),  # above the agent limit
    ("NW-100341", ["L2"], "too_small", "review", 75.65),  # opened electronics: 15% restocking fee
    ("NW-100604", ["L1"], "wrong_item", "auto", 54.5),
])
def test_the_return_policy_decides_and_prices(order_id: str, lines: list[str], reason: str, decision: str,
                                              net: float) -> None:
    result = policy.adjudicate(orders.find(order_id) or {}, lines, reason, [], TODAY)
    assert (result["decision"], result["quote"]["netRefund"]) == (decision, net)


@pytest.mark.parametrize(("order_id", "lines", "returned", "reason"), [
    ("NW-100604", ["L2"], [], "Clearance Wool Beanie was a final-sale item and is not returnable."),
    ("NW-100236", ["L1"], [], "Alpine Down Parka is 156 days past delivery, beyond the 60-day apparel return window."),
    ("NW-100559", ["L1"], [], "Order NW-100559 has not been delivered yet, so it cannot be returned."),
    ("NW-100412", ["L2"], ["l2"], "Cascade Merino Base Layer has already been returned on this order."),
    ("NW-100412", ["L9"], [], "One or more line items are not part of this order."),
])
def test_the_return_policy_refuses_with_reasons(order_id: str, lines: list[str], returned: list[str],
                                                reason: str) -> None:
    result = policy.adjudicate(orders.find(order_id) or {}, lines, "no_longer_needed", returned, TODAY)
    assert result == {"decision": "deny", "reasons": [reason]}


def test_the_breakdown_is_rendered_by_code() -> None:
    quote = policy.adjudicate(orders.find("NW-100341") or {}, ["L2"], "damaged", [], TODAY)["quote"]
    assert receipt.quote_table(quote).splitlines() == [
        "| Line | Amount |", "| --- | --- |", "| Basecamp Rechargeable Lantern x1 | $89.00 |",
        "| Items subtotal | $89.00 |", "| Restocking fee | -$13.35 |",
        "| **Net refund to Visa ending 2287** | **$75.65** |",
    ]
    assert [c["chargeId"] for c in orders.duplicate_charges(orders.find("NW-100517") or {})] == ["CH-88422", "CH-88423"]


async def test_a_named_item_and_reason_are_submitted_even_when_the_model_only_talks() -> None:
    engine, _ = engine_with([
        *replies(1, 2)[:3],
        call(("route_request", {"department": "returns"})), text("Which item, and why?"),
        text("Let me check that for you."),  # the model talks; the customer's words decide
        text("That refund needs your approval."),
    ])
    answers = await converse(engine, ["Hello", "NW-100517, ZIP 98109", "I want to return something",
                                      "The Summit GPS watch is broken."])
    doc = await engine.session_store.load(answers[-1].session)
    assert doc.flow.current_step == "ApprovalStep"
    assert state(doc, "ApprovalStep")["pending"]["request"] == {
        "orderId": "NW-100517", "lineIds": ["L1"], "reason": "damaged"}


async def test_declining_keeps_nothing_and_the_hold_is_released_after_ten_minutes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemorySessionStore()
    engine, _ = engine_with(replies(1, 2, 3, 4), store)
    session = (await converse(engine, [turn["user"] for turn in TURNS[:4]]))[-1].session
    doc = await store.load(session)
    assert doc.flow.current_step == "ApprovalStep"
    assert state(doc, "ApprovalStep")["pending"]["quote"]["netRefund"] == 364.65

    async def age(minutes: int) -> None:
        stored = await store.load(session)
        with monkeypatch.context() as patch:
            patch.setattr(store_module, "utc_now", lambda: datetime.now(UTC) - timedelta(minutes=minutes))
            await store.save(stored, stored.revision)

    await age(9)
    engine, _ = engine_with([call(("decline_refund", {"declined": True})), text("Nothing was refunded.")], store)
    (answer,) = await converse(engine, ["Hold off for now."], session)
    doc = await store.load(session)
    assert doc.flow.current_step == "ReturnsStep" and "pending" not in state(doc, "ApprovalStep")
    assert "refunds" not in state(doc, "TriageStep") and "returnedLineIds" not in state(doc, "ReturnsStep")

    # Back to approval, then eleven quiet minutes: the pending refund is dropped and the desk takes over.
    engine, _ = engine_with([call(("request_return", {"lineIds": ["L1"], "reason": "not_as_described"})),
                             text("It needs your approval.")], store)
    await converse(engine, ["Same watch, not as described."], session)
    await age(11)
    engine, provider = engine_with([text("Welcome back. Your earlier refund was not processed.")], store)
    (answer,) = await converse(engine, ["I'm back."], session)
    doc = await store.load(session)
    assert answer.session == session and doc.flow.current_step == "TriageStep"
    assert "pending" not in state(doc, "ApprovalStep") and "refunds" not in state(doc, "TriageStep")

    await age(31)  # past the idle limit: a new case
    engine, _ = engine_with([text("Hello! What is your order number?")], store)
    (answer,) = await converse(engine, ["Hello again"], session)
    assert answer.session != session


async def test_a_charge_named_by_the_customer_opens_the_ticket_in_code() -> None:
    engine, _ = engine_with([
        *replies(1, 2)[:3],
        call(("route_request", {"department": "billing"})), text("Which charge?"),
        text("I will look into it."),  # the customer named a charge: the ticket is opened regardless
        text("Ticket opened."),
    ])
    messages = ["Hi", "NW-100517, ZIP 98109", "A charge is wrong", "CH-88423 should not be there"]
    answers = await converse(engine, messages)
    doc = await engine.session_store.load(answers[-1].session)
    (ticket,) = state(doc, "TriageStep")["tickets"]
    assert (ticket["category"], ticket["amountInDispute"], ticket["customerImpact"]) == ("wrong_amount", 429, "high")
    assert "CH-88423 on 2027-06-21 for 429.00" in ticket["summary"]


async def test_with_framework_approvals_the_customer_decides_the_refund_not_the_model() -> None:
    """config approvals: true: confirm_refund waits for the customer's own decision, bound to the pending refund."""
    config = {**CONFIG, "approvals": True}
    store = MemorySessionStore()
    # Turn 4: the return is requested, then the model shows the breakdown and puts the refund to the customer.
    put_to_customer = {**call(("confirm_refund", {"confirmed": True})), "content": "$364.65 back. Please decide."}
    engine, _ = engine_with([*replies(1, 2, 3), TURNS[3]["replies"][0], put_to_customer], store)
    session = None
    for message in [turn["user"] for turn in TURNS[:4]]:
        answer = await engine.run("SupportFlow", message, session, config)
        assert answer.success, answer.detail
        session = answer.session
    [waiting] = answer.pending_approvals
    assert (waiting["tool"], waiting["approver"], waiting["step"]) == ("confirm_refund", "user", "ApprovalStep")
    doc = await store.load(session)
    assert "refunds" not in state(doc, "TriageStep")  # nothing committed on the model's word
    engine, _ = engine_with([text("Done: your refund is on its way. Anything else?")], store)
    approve = [{"id": waiting["id"], "approved": True}]
    decided = await engine.run("SupportFlow", None, session, config, approvals=approve)
    assert decided.success, decided.detail
    doc = await store.load(session)
    (refund,) = state(doc, "TriageStep")["refunds"]
    assert (refund["netRefund"], refund["authority"]) == (364.65, "customer_confirmed")
    assert doc.flow.current_step == "TriageStep" and doc.approvals[0].decided_by is None


async def test_without_the_switch_the_original_model_mediated_confirmation_stays() -> None:
    engine, _ = engine_with(replies(1, 2, 3, 4, 5))
    answers = await converse(engine, [turn["user"] for turn in TURNS[:5]])
    assert all(not answer.pending_approvals for answer in answers)
    doc = await engine.session_store.load(answers[-1].session)
    assert state(doc, "TriageStep")["refunds"][0]["authority"] == "customer_confirmed"
