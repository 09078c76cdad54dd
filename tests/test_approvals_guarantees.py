"""Two guarantees of approvals and effect replays, each held by a test of the behaviour it promises.

* A retried turn that first runs a new effect and then replays a journaled one keeps both changes, also when the
  journaled effect created the state key: its change is recorded as the items or keys it added, not as the whole
  value, so the replay adds to what the new effect put there.
* The argument digest stored with a waiting call is compared with the stored arguments before an approved call
  runs, so arguments changed in the stored document after the call was shown never run as approved.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, stay, tool
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.memory_store import MemorySessionStore

PAID: list[str] = []


class Refund(BaseModel):
    order: str
    amount: float


class LedgerStep(Step):
    def get_prompt(self) -> str:
        return "Refund orders."

    @tool(effect=True)
    async def refund(self, args: Refund) -> Any:
        """Refund an order."""
        PAID.append(args.order)
        self.save_state({"refunds": [*(self.get_state("refunds") or []), args.order]})
        return stay(f"Refunded {args.order}.")

    @tool(effect=True, approval=True)
    async def payout(self, args: Refund) -> Any:
        """Pay out an amount the user approves."""
        PAID.append(f"payout {args.order} {args.amount:.2f}")
        return stay(f"Paid {args.amount:.2f} on {args.order}.")


class LedgerFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="ledger", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [LedgerStep(self)]


def calls(tool_name: str, *orders: str, amount: float = 10) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool_name, "args": {"order": order, "amount": amount}, "id": f"c-{order}"}
                           for order in orders]}


def engine(store: MemorySessionStore, *replies: dict[str, Any]) -> FlowEngine:
    return FlowEngine([LedgerFlow], store, [ScriptedProvider(list(replies))], retry_delay=0)


@pytest.fixture(autouse=True)
def _fresh_world() -> None:
    PAID.clear()


async def retried_turn(store: MemorySessionStore, session: str) -> list[str]:
    """A turn whose first attempt refunds A1 and fails; its retry refunds B2 first, then replays A1."""
    ask = "Refund A1 and B2."
    failing = engine(store, calls("refund", "A1"), {"error": "down", "status": 400})
    failed = await failing.run("LedgerFlow", ask, session)
    assert failed.error_code == "MODEL_UNAVAILABLE"
    retried = await engine(store, calls("refund", "B2"), calls("refund", "A1"), {"content": "Both done."}).run(
        "LedgerFlow", ask, session)
    assert retried.success, retried.detail
    doc = await store.load(session)
    assert doc is not None
    refunds: list[str] = doc.flow.steps[0].state["refunds"]
    return refunds


async def test_a_replay_appends_to_a_list_that_existed_before() -> None:
    store = MemorySessionStore()
    opened = await engine(store, calls("refund", "Z0"), {"content": "ok"}).run("LedgerFlow", "Refund Z0.")
    assert await retried_turn(store, opened.session) == ["Z0", "B2", "A1"]
    assert PAID == ["Z0", "A1", "B2"]  # each refund paid once


async def test_a_replay_keeps_what_a_new_effect_put_under_a_key_the_replayed_one_created() -> None:
    store = MemorySessionStore()
    opened = await engine(store, {"content": "Hello!"}).run("LedgerFlow", "hi")
    refunds = await retried_turn(store, opened.session)
    assert PAID == ["A1", "B2"]  # two refunds paid ...
    assert sorted(refunds) == ["A1", "B2"]  # ... and both recorded (today: ["A1"] only)


async def test_an_approved_call_whose_stored_arguments_changed_does_not_run() -> None:
    store = MemorySessionStore()
    paused = await engine(store, calls("payout", "A1", amount=20)).run("LedgerFlow", "pay A1")
    [waiting] = paused.pending_approvals
    # The stored arguments change after the user was shown them (a restore hook, a migration, a hand edit).
    doc = await store.load(paused.session)
    assert doc is not None
    doc.approvals[0].calls[0].args["amount"] = 20_000
    await store.save(doc, doc.revision)
    decided = await engine(store, {"content": "done"}).run(
        "LedgerFlow", None, paused.session, approvals=[{"id": waiting["id"], "approved": True}])
    # The user approved paying 20.00: 20,000 must not be paid (today it is).
    assert "payout A1 20000.00" not in PAID, decided

