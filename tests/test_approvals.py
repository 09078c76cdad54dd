"""A person decides before a tool changes the world: pausing, deciding, expiry, races, retries, reviewers.

The flow is a refund desk: ``refund`` needs the user's decision above 100 (a predicate on the validated
arguments), ``payout`` always needs a reviewer's, ``note`` runs without anyone. Every handler run is appended to
``APPLIED``: the outside world whose changes must happen once or never.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, stay, tool, tools
from picoflow.authoring.step_tools import REVIEWER_APPROVAL_TTL, USER_APPROVAL_TTL
from picoflow.errors import PicoFlowError
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.approvals import arguments_digest
from picoflow.session.document import ApprovalCall, utc_now
from picoflow.session.memory_store import MemorySessionStore
from picoflow.session.sqlite_store import SQLiteSessionStore
from picoflow.session.store import SessionStore
from tests.support.desk_flows import APPLIED, DeskFlow, Note, Refund


def call(name: str, call_id: str, order: str = "A1", amount: float = 250, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"text": "x"} if name == "note" else {"order": order, "amount": amount}
    return {"name": name, "args": args, "id": call_id, **extra}


def calls(*items: dict[str, Any], content: str = "") -> dict[str, Any]:
    return {"content": content, "tool_calls": list(items)}


def engine_with(store: SessionStore, script: list[Any]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(script)
    return FlowEngine([DeskFlow], store, [provider], retry_delay=0), provider


@pytest.fixture(autouse=True)
def _fresh_world() -> None:
    APPLIED.clear()


@pytest.fixture(params=["memory", "sqlite", "moto", "dynamodb-local"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> SessionStore:
    if request.param == "memory":
        return MemorySessionStore()
    if request.param == "sqlite":
        return SQLiteSessionStore(tmp_path / "s.db")
    table = request.getfixturevalue("moto_dynamodb" if request.param == "moto" else "dynamodb_local_table")
    return table.store()  # type: ignore[no-any-return]


async def paused(store: SessionStore, *, caller: str | None = None, amount: float = 250) -> tuple[str, str]:
    """A session whose refund of ``amount`` waits for the user's decision: (session, approval id)."""
    engine, _ = engine_with(store, [calls(call("refund", "c1", amount=amount), content="Let me refund that.")])
    response = await engine.run("DeskFlow", "refund A1", caller=caller)
    assert response.success, response.detail
    assert len(response.pending_approvals) == 1
    return response.session, response.pending_approvals[0]["id"]


def declaring_errors() -> None:
    with pytest.raises(PicoFlowError):
        tool(approval="boss")
    with pytest.raises(PicoFlowError):
        tool(approval=True, approval_ttl=0)
    with pytest.raises(PicoFlowError):
        tool(approval_ttl=10)


def test_declaring_checks_its_arguments_and_makes_an_effect() -> None:
    declaring_errors()
    spec = ToolSpec(name="pay", description="Pay.", schema=Refund, approval="reviewer")
    assert spec.effect is True
    assert spec.approval_rule is not None and spec.approval_rule.ttl_for("reviewer") == REVIEWER_APPROVAL_TTL
    user = ToolSpec(name="pay", description="Pay.", schema=Refund, approval=True, approval_ttl=30)
    assert user.approval_rule is not None
    assert (user.approval_rule.approver, user.approval_rule.ttl_for("user")) == ("user", 30)
    plain = ToolSpec(name="p", description="P.", schema=Refund, approval=True).approval_rule
    assert plain is not None and plain.ttl_for("user") == USER_APPROVAL_TTL
    routed = ToolSpec(name="p", description="P.", schema=Refund,
                      approval=lambda a: "reviewer" if a["amount"] > 100 else a["amount"] > 10).approval_rule
    assert routed is not None
    assert [routed.approver_for({"amount": n}) for n in (5, 50, 500)] == [None, "user", "reviewer"]


async def test_a_call_needing_approval_waits_and_the_turn_commits_at_once(store: SessionStore) -> None:
    engine, provider = engine_with(store, [calls(call("refund", "c1"), call("note", "c2"), content="One moment.")])
    response = await engine.run("DeskFlow", "refund A1 and note it")
    assert response.success, response.detail
    # The note ran; the refund did not; one model call only.
    assert APPLIED == [("note", {"text": "x"})]
    assert len(provider.calls) == 1
    assert response.message == "One moment."
    [pending] = response.pending_approvals
    assert pending["tool"] == "refund" and pending["arguments"] == {"order": "A1", "amount": 250.0}
    assert pending["step"] == "DeskStep" and pending["approver"] == "user"
    envelope = response.envelope()
    assert envelope["pendingApprovals"][0]["expiresAt"] == pending["expires_at"]
    doc = await store.load(response.session)
    assert doc is not None and doc.revision == 1
    [stored] = doc.approvals
    assert stored.status == "pending" and stored.digest == arguments_digest("DeskStep", stored.calls)
    assert (stored.expires_at - stored.created_at).total_seconds() == USER_APPROVAL_TTL
    # The persisted form keeps the record under "approvals", camelCase like the rest of the document.
    assert doc.to_json_dict()["approvals"][0]["expiresAt"].endswith("Z")


async def test_a_small_refund_runs_without_a_decision(store: SessionStore) -> None:
    engine, _ = engine_with(store, [calls(call("refund", "c1", amount=20)), {"content": "Refunded."}])
    response = await engine.run("DeskFlow", "refund A1")
    assert response.success and response.pending_approvals == []
    assert APPLIED == [("refund", {"order": "A1", "amount": 20.0})]
    assert "pendingApprovals" not in response.envelope()


async def test_approved_runs_once_and_the_model_reads_its_result(store: SessionStore) -> None:
    session, approval = await paused(store)
    engine, provider = engine_with(store, [{"content": "Your refund is done."}])
    response = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert response.success, response.detail
    assert response.message == "Your refund is done." and response.pending_approvals == []
    assert APPLIED == [("refund", {"order": "A1", "amount": 250.0})]
    sent = provider.calls[0]
    assert sent[-1].type == "tool" and sent[-1].content == "Refunded 250.00 on A1."
    assert sent[-2].type == "ai" and sent[-2].tool_calls[0]["args"] == {"order": "A1", "amount": 250.0}
    doc = await store.load(session)
    assert doc is not None
    [record] = doc.approvals
    assert (record.status, record.settled) == ("approved", True)
    assert doc.flow.steps[0].state["refunds"] == ["A1"]
    # Deciding it again: 409, nothing written.
    again = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert again.error_code == "APPROVAL_NOT_PENDING" and again.status_code == 409
    assert (await store.load(session)).revision == doc.revision  # type: ignore[union-attr]
    assert len(APPLIED) == 1


async def test_denied_never_runs_and_the_model_reads_the_reason(store: SessionStore) -> None:
    session, approval = await paused(store)
    engine, provider = engine_with(store, [{"content": "Understood, no refund."}])
    response = await engine.run(
        "DeskFlow", "no thanks", session, approvals=[{"id": approval, "approved": False, "reason": "changed my mind"}]
    )
    assert response.success and response.message == "Understood, no refund."
    assert APPLIED == []
    sent = provider.calls[0]
    assert sent[-2].type == "tool" and "declined" in sent[-2].content and "changed my mind" in sent[-2].content
    assert sent[-1].type == "human" and sent[-1].content == "no thanks"
    doc = await store.load(session)
    assert doc is not None and doc.approvals[0].status == "denied" and doc.approvals[0].reason == "changed my mind"


async def test_a_new_message_while_pending_is_answered_and_the_call_stays(store: SessionStore) -> None:
    session, approval = await paused(store)
    engine, provider = engine_with(store, [{"content": "It waits for your decision."}])
    response = await engine.run("DeskFlow", "what is happening?", session)
    assert response.success and [p["id"] for p in response.pending_approvals] == [approval]
    # The model saw that the call waits.
    waiting = [m for m in provider.calls[0] if m.type == "tool"]
    assert waiting and "waits for the user's decision" in waiting[-1].content
    assert APPLIED == []


async def test_a_decision_cannot_alter_the_arguments(store: SessionStore) -> None:
    session, approval = await paused(store)
    engine, _ = engine_with(store, [{"content": "done"}])
    # Extra fields a client adds are not part of the decision: the stored arguments run.
    response = await engine.run("DeskFlow", None, session, approvals=[
        {"id": approval, "approved": True, "arguments": {"order": "ZZZ", "amount": 99999}}
    ])
    assert response.success
    assert APPLIED == [("refund", {"order": "A1", "amount": 250.0})]


async def test_someone_else_cannot_decide(store: SessionStore) -> None:
    session, approval = await paused(store, caller="alice")
    engine, _ = engine_with(store, [{"content": "done"}])
    foreign = await engine.run("DeskFlow", None, session, caller="mallory", approvals=[
        {"id": approval, "approved": True}
    ])
    assert foreign.error_code == "APPROVAL_NOT_PENDING" and APPLIED == []
    doc = await store.load(session)
    assert doc is not None and doc.approvals[0].status == "pending" and doc.revision == 1


async def test_unknown_and_malformed_decisions(store: SessionStore) -> None:
    session, _ = await paused(store)
    engine, _ = engine_with(store, [])
    unknown = await engine.run("DeskFlow", None, session, approvals=[{"id": "ap_nope", "approved": True}])
    assert unknown.error_code == "APPROVAL_NOT_PENDING"
    for bad in ([{"id": "x"}], [{"id": "", "approved": True}], "yes", [{"id": "a", "approved": True}] * 2):
        answered = await engine.run("DeskFlow", None, session, approvals=bad)  # type: ignore[arg-type]
        assert answered.error_code == "BAD_REQUEST", bad
    assert (await store.load(session)).revision == 1  # type: ignore[union-attr]


async def test_an_expired_call_is_declined_and_never_runs(store: SessionStore) -> None:
    session, approval = await paused(store)
    doc = await store.load(session)
    assert doc is not None
    doc.approvals[0].expires_at = utc_now() - timedelta(seconds=1)
    await store.save(doc, doc.revision)
    engine, provider = engine_with(store, [{"content": "ok"}])
    late = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert late.error_code == "APPROVAL_NOT_PENDING"
    answered = await engine.run("DeskFlow", "hello?", session)
    assert answered.success and answered.pending_approvals == []
    assert APPLIED == []
    assert any(m.type == "tool" and "in time" in m.content for m in provider.calls[0])
    stored = await store.load(session)
    assert stored is not None and stored.approvals[0].status == "expired"


async def test_two_decisions_racing_run_the_tool_once(store: SessionStore) -> None:
    session, approval = await paused(store)
    first, _ = engine_with(store, [{"content": "done"}])
    second, _ = engine_with(store, [{"content": "done"}])
    answers = await asyncio.gather(
        first.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}]),
        second.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": False}]),
    )
    codes = [a.error_code for a in answers]
    assert codes.count(None) == 1, codes
    assert {code for code in codes if code} <= {"APPROVAL_NOT_PENDING", "SESSION_CONFLICT"}
    assert len(APPLIED) <= 1
    doc = await store.load(session)
    assert doc is not None and doc.approvals[0].settled
    assert len(APPLIED) == (1 if doc.approvals[0].status == "approved" else 0)


async def test_a_keyed_retry_of_a_decision_replays(store: SessionStore) -> None:
    session, approval = await paused(store)
    engine, provider = engine_with(store, [{"content": "Refunded."}])
    decision = [{"id": approval, "approved": True}]
    one = await engine.run("DeskFlow", None, session, approvals=decision, idempotency_key="k" * 40)
    two = await engine.run("DeskFlow", None, session, approvals=decision, idempotency_key="k" * 40)
    assert one.success and two.replayed and two.message == one.message
    assert len(APPLIED) == 1 and len(provider.calls) == 1


async def test_a_crash_after_the_decision_is_written_is_finished_by_the_next_request(store: SessionStore) -> None:
    session, approval = await paused(store)
    # The model fails after the decision was claimed and the refund ran: the claim and the journal survive.
    engine, _ = engine_with(store, [{"error": "down", "status": 400}])
    failed = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert failed.error_code == "MODEL_UNAVAILABLE"
    assert len(APPLIED) == 1
    doc = await store.load(session)
    assert doc is not None and doc.approvals[0].status == "approved" and not doc.approvals[0].settled
    # Once the claim has lapsed, any next request settles it from the journal: the refund does not run again.
    doc.approvals[0].claimed_until = utc_now() - timedelta(seconds=1)
    await store.save(doc, doc.revision)
    engine, provider = engine_with(store, [{"content": "Your refund went through."}])
    answered = await engine.run("DeskFlow", "did it work?", session)
    assert answered.success, answered.detail
    assert len(APPLIED) == 1
    assert any(m.type == "tool" and m.content == "Refunded 250.00 on A1." for m in provider.calls[0])
    stored = await store.load(session)
    assert stored is not None and stored.approvals[0].settled
    assert stored.flow.steps[0].state["refunds"] == ["A1"]


async def test_a_live_claim_is_left_to_its_claimant(store: SessionStore) -> None:
    session, approval = await paused(store)
    doc = await store.load(session)
    assert doc is not None
    doc.approvals[0].status = "approved"
    doc.approvals[0].claimed_until = utc_now() + timedelta(seconds=60)
    await store.save(doc, doc.revision)
    engine, _ = engine_with(store, [{"content": "hi"}])
    answered = await engine.run("DeskFlow", "hello", session)
    assert answered.success and APPLIED == []
    stored = await store.load(session)
    assert stored is not None and not stored.approvals[0].settled


async def test_a_reviewer_decides_and_the_user_hears_the_follow_up(store: SessionStore) -> None:
    engine, _ = engine_with(store, [calls(call("payout", "p1"), content="I asked a colleague.")])
    first = await engine.run("DeskFlow", "goodwill please", caller="alice")
    [pending] = first.pending_approvals
    assert pending["approver"] == "reviewer"
    # The user cannot decide a reviewer's call; the owner cannot act as reviewer of their own session.
    mine = await engine.run("DeskFlow", None, first.session, caller="alice",
                            approvals=[{"id": pending["id"], "approved": True}])
    assert mine.error_code == "NOT_APPROVER" and mine.status_code == 403
    own = await engine.decide("DeskFlow", first.session, pending["id"], True, reviewer="alice")
    assert own.error_code == "NOT_APPROVER"
    reviewer_engine, reviewer_provider = engine_with(store, [])
    decided = await reviewer_engine.decide("DeskFlow", first.session, pending["id"], True, reviewer="bob")
    assert decided.success, decided.detail
    assert APPLIED == [("payout", {"order": "A1", "amount": 250.0})] and reviewer_provider.calls == []
    doc = await store.load(first.session)
    assert doc is not None and doc.approvals[0].decided_by == "bob" and doc.approvals[0].settled
    again = await reviewer_engine.decide("DeskFlow", first.session, pending["id"], True, reviewer="bob")
    assert again.error_code == "APPROVAL_NOT_PENDING"
    # The user's next turn: the model reads the payout's result.
    user_engine, provider = engine_with(store, [{"content": "Your credit was paid."}])
    follow = await user_engine.run("DeskFlow", "any news?", first.session, caller="alice")
    assert follow.message == "Your credit was paid."
    assert any(m.type == "tool" and m.content == "Paid 250.00 on A1." for m in provider.calls[0])
    assert len(APPLIED) == 1


async def test_reviewers_list_waiting_calls_from_the_stores_index(store: SessionStore) -> None:
    engine, _ = engine_with(store, [
        calls(call("payout", "p1", order="B7")), calls(call("payout", "p2", order="C8")), calls(call("refund", "r"))
    ])
    one = await engine.run("DeskFlow", "credit please", caller="alice")
    two = await engine.run("DeskFlow", "credit please", caller="carol")
    user_only = await engine.run("DeskFlow", "refund please", caller="dave")
    assert user_only.pending_approvals[0]["approver"] == "user"
    listed = await eventually(store, 2)
    assert [(e["session"], e["arguments"]["order"]) for e in listed] == [(one.session, "B7"), (two.session, "C8")]
    assert listed[0]["flowName"] == "DeskFlow" and listed[0]["tool"] == "payout"
    decided = await engine.decide("DeskFlow", one.session, listed[0]["id"], False, reason="no", reviewer="bob")
    assert decided.success
    assert [e["session"] for e in await eventually(store, 1)] == [two.session]
    await store.delete(two.session)
    assert await eventually(store, 0) == []


async def eventually(store: SessionStore, count: int) -> list[dict[str, Any]]:
    """The store's review list once it holds ``count`` entries (a DynamoDB index is eventually consistent)."""
    for _ in range(50):
        listed = await store.list_reviews()
        if len(listed) == count:
            return listed
        await asyncio.sleep(0.1)
    return await store.list_reviews()


async def test_a_reviewer_cannot_reach_a_session_that_does_not_exist(store: SessionStore) -> None:
    engine, _ = engine_with(store, [])
    missing = await engine.decide("DeskFlow", "nosuchsession", "ap_x", True, reviewer="bob")
    assert missing.error_code == "APPROVAL_NOT_PENDING"


class GroupStep(Step):
    def get_prompt(self) -> str:
        return "Batch."

    def use_tools(self) -> list[str]:
        return ["ship", "bill"]

    @tools(["ship", "bill"], effect=True, approval=True)
    async def ship_and_bill(self, batch: list[dict[str, Any]]) -> Any:
        APPLIED.extend((c["name"], c["args"]) for c in batch)
        return stay("shipped and billed")


class GroupFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="group", retry_attempts=1)

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="ship", description="Ship.", schema=Note), ToolSpec(name="bill", description="Bill.",
                                                                                   schema=Note)]

    def define_steps(self) -> list[Step]:
        return [GroupStep(self)]


async def test_a_group_waits_as_one_batch(store: SessionStore) -> None:
    provider = ScriptedProvider([
        calls({"name": "ship", "args": {"text": "a"}, "id": "s"}, {"name": "bill", "args": {"text": "b"}, "id": "b"}),
        {"content": "All done."},
    ])
    engine = FlowEngine([GroupFlow], store, [provider], retry_delay=0)
    first = await engine.run("GroupFlow", "go")
    [pending] = first.pending_approvals
    assert pending["tool"] == "ship+bill"
    assert pending["arguments"] == [{"tool": "ship", "arguments": {"text": "a"}},
                                    {"tool": "bill", "arguments": {"text": "b"}}]
    assert APPLIED == []
    done = await engine.run("GroupFlow", None, first.session, approvals=[{"id": pending["id"], "approved": True}])
    assert done.success and done.message == "All done."
    assert APPLIED == [("ship", {"text": "a"}), ("bill", {"text": "b"})]


def test_the_digest_binds_step_tool_and_arguments() -> None:
    one = [ApprovalCall(name="refund", args={"order": "A1", "amount": 250.0})]
    assert arguments_digest("DeskStep", one) == arguments_digest("DeskStep", [ApprovalCall(
        name="refund", args={"amount": 250.0, "order": "A1"})])
    assert arguments_digest("DeskStep", one) != arguments_digest("DeskStep", [ApprovalCall(
        name="refund", args={"order": "A1", "amount": 251.0})])


async def test_the_same_decision_retried_is_taken_up_once_its_claim_lapses(store: SessionStore) -> None:
    session, approval = await paused(store)
    decision = [{"id": approval, "approved": True}]
    engine, _ = engine_with(store, [{"error": "down", "status": 400}])
    assert (await engine.run("DeskFlow", None, session, approvals=decision)).error_code == "MODEL_UNAVAILABLE"
    # At once: the failed request's claim still holds the call, so the retry is told to come back (retryable).
    engine, _ = engine_with(store, [{"content": "Refunded."}])
    early = await engine.run("DeskFlow", None, session, approvals=decision)
    assert early.error_code == "SESSION_CONFLICT" and early.retry_after
    # A different verdict is not a retry: the call was decided.
    other = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": False}])
    assert other.error_code == "APPROVAL_NOT_PENDING"
    doc = await store.load(session)
    assert doc is not None
    doc.approvals[0].claimed_until = utc_now() - timedelta(seconds=1)
    await store.save(doc, doc.revision)
    done = await engine.run("DeskFlow", None, session, approvals=decision)
    assert done.success and done.message == "Refunded."
    assert len(APPLIED) == 1


async def test_the_committed_stream_event_carries_the_waiting_calls() -> None:
    store = MemorySessionStore()
    engine, _ = engine_with(store, [calls(call("refund", "c1"), content="One moment.")])
    events = [event async for event in engine.stream("DeskFlow", "refund A1")]
    final = events[-1]
    assert final.event == "committed"
    [waiting] = final.data["pendingApprovals"]
    assert waiting["tool"] == "refund" and waiting["expiresAt"].endswith("Z")
    decided, _ = engine_with(store, [{"content": "Done."}])
    streamed = [event async for event in decided.stream(
        "DeskFlow", None, final.data["session"], approvals=[{"id": waiting["id"], "approved": True}]
    )]
    assert streamed[-1].event == "committed" and streamed[-1].data["message"] == "Done."
    assert "".join(e.data["text"] for e in streamed if e.event == "delta") == "Done."
    assert APPLIED == [("refund", {"order": "A1", "amount": 250.0})]


async def test_stored_arguments_changed_after_the_pause_never_run(store: SessionStore) -> None:
    session, approval = await paused(store)
    doc = await store.load(session)
    assert doc is not None
    doc.approvals[0].calls[0].args = {"order": "A1", "amount": 99999.0}  # the digest still names 250
    await store.save(doc, doc.revision)
    engine, _ = engine_with(store, [{"content": "Sorry."}])
    answered = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert answered.success and APPLIED == []
    stored = await store.load(session)
    assert stored is not None and stored.approvals[0].status == "denied"
    assert any(entry.message == "approval arguments changed" for entry in stored.error)


@pytest.mark.parametrize("backend", ["moto", "dynamodb-local"])
async def test_what_pausing_and_deciding_cost_on_dynamodb(request: pytest.FixtureRequest, backend: str) -> None:
    """Pausing costs an ordinary turn (one read, one conditional write); a decision adds the claim's write before
    the tool runs, and the approved call's journal read and write."""
    table = request.getfixturevalue("moto_dynamodb" if backend == "moto" else "dynamodb_local_table")
    store = table.store()
    session, approval = await paused(store)
    sent: list[str] = []
    store.client.meta.events.register("before-call.dynamodb", lambda model, **_: sent.append(model.name))
    engine, _ = engine_with(store, [calls(call("refund", "c2", order="B2"), content="That one waits too.")])
    await engine.run("DeskFlow", "and B2", session)
    assert sent == ["GetItem", "PutItem"]
    pending = (await store.load(session)).approvals  # type: ignore[union-attr]
    sent.clear()
    engine, _ = engine_with(store, [{"content": "Refunded."}])
    decided = await engine.run("DeskFlow", None, session, approvals=[{"id": approval, "approved": True}])
    assert decided.success and [p["id"] for p in decided.pending_approvals] == [pending[1].id]
    assert sent == ["GetItem", "PutItem", "GetItem", "PutItem", "PutItem"]
