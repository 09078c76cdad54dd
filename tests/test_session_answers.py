"""What the session's life answers without running a turn: a keyed turn's stored answer (replayed for a retry, or
read back to settle a lost write), a delete's typed outcome, and the MCP sessions one engine owns."""

from __future__ import annotations

import dataclasses

import pytest

from picoflow import FlowEngine
from picoflow.errors import IdempotencyKeyMismatchError, IdempotencyKeyReusedError
from picoflow.lifecycle import Deletion, SessionLocks, TurnRequest, delete, keep_receipt, recorded_answer, replay
from picoflow.mcp import MCPServerSpec, MCPSessions
from picoflow.results import RunResponse
from picoflow.session.document import SessionDoc, new_document
from picoflow.stores import MemorySessionStore

TURN = TurnRequest(flow_name="F", message="hi", session_id=None, config=None, request_id="r1", key="k1",
                   request="body-1", first_id="s-first")


def answered_session(session_id: str = "s1", revision: int = 1) -> SessionDoc:
    doc = new_document({"name": "F"}, session_id=session_id)
    doc.revision = revision
    keep_receipt(doc, TURN, RunResponse(success=True, completed=False, message="hello", session=session_id))
    return doc


def test_a_retry_replays_its_answer_and_a_misused_key_is_refused() -> None:
    doc = answered_session()
    replayed = replay(doc, TURN)
    assert replayed is not None and replayed.message == "hello" and replayed.replayed
    with pytest.raises(IdempotencyKeyMismatchError):
        replay(doc, dataclasses.replace(TURN, request="another body"))
    moved_on = new_document({"name": "F"}, session_id="s-first")
    moved_on.revision = 4
    with pytest.raises(IdempotencyKeyReusedError):
        replay(moved_on, TURN)
    assert replay(doc, dataclasses.replace(TURN, key=None)) is None


def test_reading_back_finds_the_answer_of_this_very_request_and_never_raises() -> None:
    doc = answered_session()
    found = recorded_answer(doc, TURN)
    assert found is not None and found.message == "hello"
    assert recorded_answer(doc, dataclasses.replace(TURN, request="another body")) is None
    moved_on = new_document({"name": "F"}, session_id="s-first")
    moved_on.revision = 4
    assert recorded_answer(moved_on, TURN) is None


async def test_a_delete_answers_a_typed_outcome_whose_envelope_is_the_engines() -> None:
    store = MemorySessionStore()
    doc = await store.create({"name": "F"})
    assert await delete(store, SessionLocks(), doc.id, None) == Deletion(doc.id)
    gone = await delete(store, SessionLocks(), doc.id, None)
    assert (gone.code, gone.session) == ("SESSION_NOT_FOUND", doc.id) and gone.message
    assert gone.envelope() == {"success": False, "message": gone.message, "session": doc.id,
                               "code": "SESSION_NOT_FOUND"}
    assert Deletion("s").envelope() == {"success": True, "session": "s"}
    refused = await delete(store, SessionLocks(), "bad id!", None)
    assert refused.code == "BAD_REQUEST"


async def test_each_engine_owns_its_mcp_sessions_and_what_they_remember() -> None:
    first, second = FlowEngine(), FlowEngine()
    assert isinstance(first.mcp, MCPSessions) and first.mcp is not second.mcp
    spec = MCPServerSpec.http("down", "http://127.0.0.1:9/mcp")
    first.mcp.pause_offers(spec, 60)
    assert first.mcp.offer_paused(spec) and not second.mcp.offer_paused(spec)
    first.mcp.pause_offers(spec, None)
    assert not first.mcp.offer_paused(spec)
    problem = ("left out", spec.connection_key(), "tool")
    assert first.mcp.first_report(problem) and not first.mcp.first_report(problem)
    assert second.mcp.first_report(problem)
    await first.close()
