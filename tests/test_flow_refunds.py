"""RefundFlow: the scripted case replays to completion, and a refund turn retried after a failure refunds once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.refunds import RefundFlow, orders, payments
from picoflow import FlowEngine
from picoflow.errors import SessionStoreError
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import SessionDoc
from picoflow.session.memory_store import MemorySessionStore

CONVERSATION = json.loads((Path(__file__).resolve().parents[1] / "flows/refunds/conversation.json").read_text())
TURNS = CONVERSATION["turns"]
REFUND_TURN = 2


def engine_on(store: MemorySessionStore, turns: list[dict[str, Any]]) -> FlowEngine:
    """An engine whose every model call is served from the turns' scripted replies."""
    script = ScriptedProvider([reply for turn in turns for reply in turn["replies"]])
    return FlowEngine([RefundFlow], store, ProviderRegistry(override=script))


class FailingSaves(MemorySessionStore):
    """A memory store whose next ``failures`` saves fail as a store outage would, before anything is written."""

    failures = 0

    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        if self.failures:
            self.failures -= 1
            raise SessionStoreError("save", doc.id, "simulated outage", status_code=503)
        return await super().save(doc, expected_revision)


async def converse(engine: FlowEngine, turns: list[dict[str, Any]], session: str | None = None) -> list[Any]:
    answers = []
    for turn in turns:
        response = await engine.run("RefundFlow", turn["user"], session)
        assert response.success, response.message
        session = response.session
        answers.append(response)
    return answers


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


async def test_a_refund_turn_retried_after_a_store_outage_refunds_once() -> None:
    store = FailingSaves()
    engine = engine_on(store, TURNS[:REFUND_TURN])
    session = (await converse(engine, TURNS[:REFUND_TURN]))[-1].session
    issued = payments.refunds_issued()

    store.failures = 1
    refund_turn = TURNS[REFUND_TURN]
    engine = engine_on(store, [refund_turn])
    failed = await engine.run("RefundFlow", refund_turn["user"], session)
    assert failed.error_code == "SESSION_STORE_ERROR"
    assert payments.refunds_issued() == issued + 1

    # The client retries (no key, same session): the refund is replayed from the journal, with its reference.
    engine = engine_on(store, [refund_turn])
    retried = await engine.run("RefundFlow", refund_turn["user"], session)
    assert retried.success
    assert payments.refunds_issued() == issued + 1
    doc = await store.load(session)
    assert doc is not None
    triage = next(step for step in doc.flow.steps if step.name == "TriageStep")
    (refund,) = triage.state["refunds"]
    assert refund["reference"] in retried.message
    assert [entry.message for entry in doc.log if entry.message.startswith("effect")] == ["effect replayed"]


@pytest.mark.parametrize(("reason", "amount"), [("defective", 89.0), ("changed_mind", 75.65)])
def test_the_return_policy_keeps_a_restocking_fee_unless_defective(reason: str, amount: float) -> None:
    headphones, case = orders.ORDERS["A1001"].items
    assert orders.refund_amount(headphones, reason) == amount
    assert orders.refund_amount(case, "defective") is None  # final sale
    assert orders.verified("a1001", "97201") is not None and orders.verified("A1001", "00000") is None
