"""RefundFlow: the scripted case replays to completion, and a refund turn retried after a failure refunds once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flows.refunds import RefundFlow, orders, payments
from picoflow import FlowEngine
from picoflow.errors import SessionStoreError
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import SessionDoc, utc_now
from picoflow.session.memory_store import MemorySessionStore

CONVERSATION = json.loads((Path(__file__).resolve().parents[1] / "flows/refunds/conversation.json").read_text())
TURNS = CONVERSATION["turns"]
#: The turn that asks for the refund (it waits for the customer's approval) and the one that approves it.
ASK_TURN, REFUND_TURN = 2, 3


def engine_on(store: MemorySessionStore, turns: list[dict[str, Any]]) -> FlowEngine:
    """An engine whose every model call is served from the turns' scripted replies."""
    script = ScriptedProvider([reply for turn in turns for reply in turn["replies"]])
    return FlowEngine([RefundFlow], store, ProviderRegistry(override=script))


class FailingSaves(MemorySessionStore):
    """A memory store whose next ``failures`` saves fail as a store outage would, before anything is written."""

    failures = 0
    #: Saves that succeed before the failures start.
    passes = 0

    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        if self.passes:
            self.passes -= 1
        elif self.failures:
            self.failures -= 1
            raise SessionStoreError("save", doc.id, "simulated outage", status_code=503)
        return await super().save(doc, expected_revision)


async def converse(engine: FlowEngine, turns: list[dict[str, Any]], session: str | None = None,
                   waiting: list[dict[str, Any]] | None = None) -> list[Any]:
    """Send the turns in order; a ``decision`` turn decides every call the previous reply left waiting."""
    answers: list[Any] = []
    for turn in turns:
        response = await engine.run("RefundFlow", turn.get("user"), session, approvals=decided(turn, waiting or []))
        assert response.success, response.message
        session, waiting = response.session, response.pending_approvals
        answers.append(response)
    return answers


def decided(turn: dict[str, Any], waiting: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    decision = turn.get("decision")
    return [{"id": item["id"], **decision} for item in waiting] if decision else None


async def test_the_scripted_case_refunds_by_policy_and_closes() -> None:
    store = MemorySessionStore()
    engine = engine_on(store, TURNS)
    answers = await converse(engine, TURNS)
    assert answers[-1].completed
    assert "89.00 USD for the Wireless headphones has been issued" in answers[REFUND_TURN].message
    doc = await store.load(answers[-1].session)
    assert doc is not None
    triage = next(step for step in doc.flow.steps if step.name == "TriageStep")
    assert [(r["sku"], r["amount"]) for r in triage.state["refunds"]] == [("HP-200", 89.0)]


async def test_the_refund_waits_for_the_customer_and_runs_once_approved() -> None:
    store = MemorySessionStore()
    issued = payments.refunds_issued()
    answers = await converse(engine_on(store, TURNS[: ASK_TURN + 1]), TURNS[: ASK_TURN + 1])
    [pending] = answers[-1].pending_approvals
    assert (pending["tool"], pending["approver"]) == ("refund_item", "user")
    assert pending["arguments"] == {"sku": "HP-200", "reason": "defective"}
    assert payments.refunds_issued() == issued


async def test_an_approval_retried_after_a_store_outage_refunds_once() -> None:
    store = FailingSaves()
    engine = engine_on(store, TURNS[:REFUND_TURN])
    asked = (await converse(engine, TURNS[:REFUND_TURN]))[-1]
    session, waiting = asked.session, asked.pending_approvals
    issued = payments.refunds_issued()

    # The decision's claim is written; the refund runs; the turn's own save fails.
    store.passes, store.failures = 1, 1
    engine = engine_on(store, [])
    failed = await engine.run("RefundFlow", None, session, approvals=decided(TURNS[REFUND_TURN], waiting))
    assert failed.error_code == "SESSION_STORE_ERROR"
    assert payments.refunds_issued() == issued + 1

    # The client retries the same decision once the failed request's claim has lapsed: replayed, not re-run.
    doc = await store.load(session)
    assert doc is not None and doc.approvals[0].status == "approved" and not doc.approvals[0].settled
    doc.approvals[0].claimed_until = utc_now() - timedelta(seconds=1)
    await store.save(doc, doc.revision)
    retried = await engine.run("RefundFlow", None, session, approvals=decided(TURNS[REFUND_TURN], waiting))
    assert retried.success, retried.detail
    assert payments.refunds_issued() == issued + 1
    doc = await store.load(session)
    assert doc is not None
    triage = next(step for step in doc.flow.steps if step.name == "TriageStep")
    (refund,) = triage.state["refunds"]
    assert refund["reference"] in retried.message
    assert [entry.message for entry in doc.log if entry.message.startswith("effect")] == ["effect replayed"]


async def test_a_refund_above_the_limit_waits_for_a_reviewer() -> None:
    store = MemorySessionStore()
    script = [
        {"content": "", "tool_calls": [{"name": "verify_order", "args": {"order_id": "A1002", "zip_code": "10001"}}]},
        {"content": "", "tool_calls": [{"name": "start_return", "args": {}}]},
        {"content": "Verified. Which item, and why?"},
        {"content": "", "tool_calls": [{"name": "refund_item", "args": {"sku": "KB-7", "reason": "changed_mind"}}]},
        {"content": "Your refund went through."},
    ]
    engine = FlowEngine([RefundFlow], store, ProviderRegistry(override=ScriptedProvider(script)))
    first = await engine.run("RefundFlow", "Return my keyboard from A1002, ZIP 10001", caller="ann")
    asked = await engine.run("RefundFlow", "The keyboard, I changed my mind.", first.session, caller="ann")
    [pending] = asked.pending_approvals
    assert pending["approver"] == "reviewer"  # 129.00 less the restocking fee is 109.65, above 100
    issued = payments.refunds_issued()
    decided_now = await engine.decide("RefundFlow", first.session, pending["id"], True, reviewer="rita")
    assert decided_now.success and payments.refunds_issued() == issued + 1
    follow = await engine.run("RefundFlow", "Any news?", first.session, caller="ann")
    assert follow.success


@pytest.mark.parametrize(("reason", "amount"), [("defective", 89.0), ("changed_mind", 75.65)])
def test_the_return_policy_keeps_a_restocking_fee_unless_defective(reason: str, amount: float) -> None:
    headphones, case = orders.ORDERS["A1001"].items
    assert orders.refund_amount(headphones, reason) == amount
    assert orders.refund_amount(case, "defective") is None  # final sale
    assert orders.verified("a1001", "97201") is not None and orders.verified("A1001", "00000") is None
