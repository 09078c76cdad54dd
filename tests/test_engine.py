"""FlowEngine: registration, session restore rules, conflicts, locking, deletion and models."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, go, tool
from picoflow.aws.runtime import build_engine
from picoflow.errors import PicoFlowError, public_message
from picoflow.logger import SessionLogger
from picoflow.messages import from_message_doc, to_message_doc
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import SESSION_DOC_VERSION
from picoflow.stores import MemorySessionStore, SessionDoc
from tests.support.engine import call, scripted_engine, text


class NoteArgs(BaseModel):
    note: str


class WelcomeStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="remember", description="Remember a note", schema=NoteArgs)]

    @tool
    async def remember(self, args: dict) -> object:
        self.save_state({"note": args["note"]})
        self.save_transient_state({"scratch": args["note"].upper()})
        return go(WelcomeStep).with_tool_feedback("noted")

    def get_prompt(self) -> str:
        scratch = self.get_transient_state("scratch")
        return f"tenant={self.get_context('config.tenant')} scratch={scratch}"


class VipStep(Step):
    pass


class ContextFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m", params={"temperature": 0.1, "api_key": "sk-secret"})

    def define_steps(self) -> list[Step]:
        return [WelcomeStep(self), VipStep(self).use_model({"provider": "scripted", "name": "other"})]

    def initial_step(self) -> type[Step] | None:
        return VipStep if self.get_context("config.vip") else None


class OtherFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [WelcomeStep(self)]


def test_registration_by_list_and_mapping_with_validation():
    scripted = ProviderRegistry(override=ScriptedProvider([]))
    engine = FlowEngine(flows=[ContextFlow], session_store=MemorySessionStore(), providers=scripted)
    assert engine.get_flow_names() == ["ContextFlow"]
    engine.register_flows({"OtherFlow": OtherFlow})
    assert engine.get_flow("OtherFlow") is OtherFlow
    with pytest.raises(PicoFlowError, match="Flow 'OtherFlow' is already registered."):
        engine.register_flow(OtherFlow)
    with pytest.raises(PicoFlowError, match="must match Flow ID"):
        FlowEngine(flows={"Stable": OtherFlow}, session_store=MemorySessionStore(), providers=scripted)
    fresh = FlowEngine(session_store=MemorySessionStore(), providers=scripted)
    with pytest.raises(PicoFlowError):
        fresh.register_flows([OtherFlow, OtherFlow])
    assert fresh.get_flow_names() == []  # the batch is all-or-nothing


async def test_unknown_flow_and_bad_input_are_failures_not_exceptions():
    engine, _ = scripted_engine([OtherFlow], [])
    missing = await engine.run("NoSuchFlow", "hi")
    assert (missing.success, missing.completed, missing.session) == (False, False, "")
    assert missing.error_code == "FLOW_NOT_FOUND" and missing.message == public_message("FLOW_NOT_FOUND")
    assert "NoSuchFlow" in missing.detail
    bad_config = await engine.run("OtherFlow", "hi", config=["not", "a", "dict"])
    assert bad_config.status_code == 400
    bad_id = await engine.run("OtherFlow", "hi", session_id="../etc/passwd")
    assert bad_id.status_code == 400 and bad_id.error_code == "BAD_REQUEST"


async def test_a_message_of_whitespace_only_is_no_message():
    engine, provider = scripted_engine([OtherFlow], [text("Hello."), text("Still here.")])
    first = await engine.run("OtherFlow", "hi")
    second = await engine.run("OtherFlow", " \r\n\t", session_id=first.session)
    assert second.success and second.message == "Still here."
    # The model saw no blank user turn (chat services refuse one), and none was stored.
    assert [message.content for message in provider.calls[1] if isinstance(message, HumanMessage)][-1] == "hi"
    doc = await engine.session_store.load(first.session)
    stored = [m for namespace in doc.flow.memory.values() for m in namespace.messages if m.type == "human"]
    assert stored and all(m.content.strip() for m in stored)


async def test_context_is_fixed_at_creation_and_transient_state_is_gone_next_turn():
    engine, model = scripted_engine(
        [ContextFlow], [call(("remember", {"note": "blue"})), text("noted it"), text("second turn")]
    )
    first = await engine.run("ContextFlow", "remember blue", config={"tenant": "acme"})
    assert first.message == "noted it"
    assert model.calls[1][0].content == "tenant=acme scratch=BLUE"  # transient visible within the turn
    second = await engine.run("ContextFlow", "hi", first.session, config={"tenant": "evil"})
    assert second.message == "second turn"
    assert model.calls[2][0].content == "tenant=acme scratch=None"  # context kept, transient gone
    doc = await engine.session_store.load(first.session)
    state = {s.name: s.state for s in doc.flow.steps}["WelcomeStep"]
    assert state["note"] == "blue" and "_transient" not in state
    assert doc.flow.context == {"config": {"tenant": "acme"}}


async def test_initial_step_from_context_and_model_overrides_are_persisted_without_secrets():
    engine, model = scripted_engine([ContextFlow], [text("hello vip")])
    response = await engine.run("ContextFlow", "hi", config={"vip": True})
    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "VipStep"
    assert model.selections[0].name == "other"
    dumped = doc.to_json_dict()
    assert dumped["flow"]["model"] == {
        "provider": "scripted", "name": "m", "params": {"temperature": 0.1}, "retryAttempts": 3,
    }
    steps = {s["name"]: s for s in dumped["flow"]["steps"]}
    assert steps["VipStep"]["model"]["name"] == "other"
    assert "model" not in steps["WelcomeStep"]
    assert "sk-secret" not in json.dumps(dumped)


def test_an_invalid_initial_step_and_an_unknown_provider_fail_at_registration():
    class BadInitial(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [WelcomeStep(self)]

        def initial_step(self) -> type[Step] | None:
            return VipStep

    with pytest.raises(PicoFlowError, match="Flow 'BadInitial': initial_step\\(\\) names step 'VipStep'"):
        scripted_engine([BadInitial], [])
    with pytest.raises(PicoFlowError, match="provider 'scripted' is not registered"):
        FlowEngine(flows=[OtherFlow], session_store=MemorySessionStore(), providers=[])


async def test_an_initial_step_chosen_from_the_request_config_fails_that_turn_clearly():
    class ConfiguredInitial(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [WelcomeStep(self)]

        def initial_step(self) -> type[Step] | None:
            return VipStep if self.get_context("config.vip") else None

    engine, _ = scripted_engine([ConfiguredInitial], [])
    response = await engine.run("ConfiguredInitial", "hi", config={"vip": True})
    assert not response.success
    assert (response.error_code, response.status_code) == ("FLOW_SETUP_FAILED", 500)
    assert response.message == public_message("FLOW_SETUP_FAILED")
    assert response.detail == "PicoFlowError: Initial step 'VipStep' is not defined in flow 'ConfiguredInitial'."


async def test_flow_mismatch_leaves_the_stored_document_byte_for_byte_unchanged():
    engine, _ = scripted_engine([ContextFlow, OtherFlow], [text("hi")])
    first = await engine.run("ContextFlow", "hi")
    before = (await engine.session_store.load(first.session)).model_dump_json()
    mismatch = await engine.run("OtherFlow", "hi", first.session)
    assert (mismatch.success, mismatch.status_code, mismatch.error_code) == (False, 409, "SESSION_FLOW_MISMATCH")
    assert mismatch.message == public_message("SESSION_FLOW_MISMATCH")
    assert mismatch.detail == (
        f"Session '{first.session}' belongs to flow 'ContextFlow', not 'OtherFlow'. "
        "Start a new session for that flow."
    )
    assert mismatch.session == first.session
    assert (await engine.session_store.load(first.session)).model_dump_json() == before


async def test_concurrent_writer_loses_with_a_conflict_and_writes_nothing():
    store = MemorySessionStore()
    engine_a, _ = scripted_engine([OtherFlow], [text("one"), {"content": "slow", "delay": 0.2}], store=store)
    engine_b, _ = scripted_engine([OtherFlow], [text("fast")], store=store)
    first = await engine_a.run("OtherFlow", "hi")
    slow, fast = await asyncio.gather(
        engine_a.run("OtherFlow", "slow", first.session), engine_b.run("OtherFlow", "fast", first.session)
    )
    assert fast.success
    assert (slow.success, slow.status_code, slow.error_code) == (False, 409, "SESSION_CONFLICT")
    assert slow.message == public_message("SESSION_CONFLICT")
    assert slow.detail == f"Session '{first.session}' was changed or removed by another request."
    doc = await store.load(first.session)
    assert doc.revision == 2 and doc.run_status == "running"
    contents = [m.content for m in doc.flow.memory["WelcomeStep"].messages]
    assert "fast" in contents and "slow" not in contents


async def test_turns_on_one_session_in_one_engine_run_one_after_another():
    engine, _ = scripted_engine(
        [OtherFlow], [text("one"), {"content": "two", "delay": 0.1}, text("three")]
    )
    first = await engine.run("OtherFlow", "hi")
    second, third = await asyncio.gather(
        engine.run("OtherFlow", "a", first.session), engine.run("OtherFlow", "b", first.session)
    )
    assert second.success and third.success  # the lock serialised them, so neither conflicted
    assert (await engine.session_store.load(first.session)).revision == 3


class MigratingFlow(OtherFlow):
    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        doc = await super().on_restore_session_doc(doc)
        if doc is not None and "migrated" not in doc.flow.context:
            doc.flow.context["migrated"] = True
        return doc


async def test_restore_hook_changes_are_written_and_an_unchanged_restore_costs_no_write():
    store = MemorySessionStore()
    writes = []
    original_save = store.save

    async def counting_save(doc, expected):
        writes.append(expected)
        return await original_save(doc, expected)

    store.save = counting_save
    original_insert = store.insert

    async def counting_insert(doc):
        # A new session's first write is its insert (one write per first turn).
        writes.append(0)
        return await original_insert(doc)

    store.insert = counting_insert
    engine, _ = scripted_engine([MigratingFlow], [text("a"), text("b"), text("c")], store=store)
    first = await engine.run("MigratingFlow", "hi")
    assert writes == [0]
    await engine.run("MigratingFlow", "again", first.session)
    assert writes == [0, 1, 2]  # the migration was written before the turn's own save
    await engine.run("MigratingFlow", "third", first.session)
    assert writes == [0, 1, 2, 3]  # nothing changed, so only the turn's save
    doc = await store.load(first.session)
    assert doc.flow.context["migrated"] is True and doc.revision == 4


async def test_an_old_document_version_starts_a_new_session_and_keeps_the_old_one():
    store = MemorySessionStore()
    engine, _ = scripted_engine([OtherFlow], [text("a"), text("b")], store=store)
    first = await engine.run("OtherFlow", "hi")
    doc = await store.load(first.session)
    doc.version = 1.0
    await store.save(doc, doc.revision)
    second = await engine.run("OtherFlow", "hi", first.session)
    assert second.success and second.session != first.session
    assert (await store.load(first.session)).version == 1.0
    assert SESSION_DOC_VERSION == 1.5


async def test_delete_session_removes_the_document_and_reports_missing_ones_as_not_found():
    engine, _ = scripted_engine([OtherFlow], [text("a")])
    first = await engine.run("OtherFlow", "hi")
    assert await engine.delete_session(first.session) == {"success": True, "session": first.session}
    assert await engine.session_store.load(first.session) is None
    for missing in (first.session, "0" * 32):
        gone = await engine.delete_session(missing)
        assert (gone["success"], gone["code"], gone["message"]) == (False, "SESSION_NOT_FOUND", "No such session.")
    assert (await engine.delete_session(""))["success"] is True
    assert (await engine.delete_session("bad id!"))["success"] is False


async def test_a_session_belongs_to_the_principal_that_created_it():
    replies = [text("for alice"), text("for bob"), text("anon"), text("alice again")]
    engine, model = scripted_engine([OtherFlow], replies)
    alice = await engine.run("OtherFlow", "my secret", caller="alice")
    doc = await engine.session_store.load(alice.session)
    assert doc.owner == "alice"

    # Another principal, or an anonymous caller, gets what an unknown id gets: a new session of its own.
    for caller in ("bob", None):
        other = await engine.run("OtherFlow", "what did they say?", session_id=alice.session, caller=caller)
        assert other.success and other.session != alice.session
        assert "my secret" not in str(model.calls[-1])
        assert (await engine.session_store.load(other.session)).owner == caller
        ended = await engine.delete_session(alice.session, caller=caller)
        assert ended["code"] == "SESSION_NOT_FOUND"
        assert ended == await engine.delete_session("f" * 32, caller=caller) | {"session": alice.session}
    assert (await engine.session_store.load(alice.session)).revision == 1

    again = await engine.run("OtherFlow", "me again", session_id=alice.session, caller="alice")
    assert again.session == alice.session and "my secret" in str(model.calls[-1])
    assert (await engine.delete_session(alice.session, caller="alice"))["success"] is True


async def test_an_anonymous_session_stays_open_to_anyone_with_its_id():
    engine, _ = scripted_engine([OtherFlow], [text("a"), text("b")])
    anonymous = await engine.run("OtherFlow", "hi")
    assert (await engine.session_store.load(anonymous.session)).owner is None
    signed_in = await engine.run("OtherFlow", "hello", session_id=anonymous.session, caller="carol")
    assert signed_in.session == anonymous.session
    assert (await engine.session_store.load(anonymous.session)).owner is None


async def test_the_turn_deadline_stops_before_a_model_call():
    engine, model = scripted_engine([OtherFlow], [text("never")])
    response = await engine.run("OtherFlow", "hi", deadline=time.monotonic() + 0.2)
    assert (response.success, response.error_code, response.status_code) == (False, "TURN_DEADLINE", 504)
    assert model.calls == []


async def test_token_usage_accumulates_across_calls_and_turns():
    engine, _ = scripted_engine(
        [ContextFlow],
        [
            call(("remember", {"note": "x"}), input_tokens=100, output_tokens=7),
            {"content": "ok", "usage": {"input_tokens": 50, "output_tokens": 20,
                                        "input_token_details": {"cache_read": 30},
                                        "output_token_details": {"reasoning": 5}}},
        ],
    )
    response = await engine.run("ContextFlow", "x")
    tokens = (await engine.session_store.load(response.session)).to_json_dict()["tokens"]
    assert tokens == {
        "inputTokens": 150, "outputTokens": 27, "totalTokens": 177, "reasoningTokens": 5,
        "visibleOutputTokens": 22, "cachedInputTokens": 30, "cacheCreationInputTokens": 0,
    }


def test_run_sync_and_the_session_logger():
    engine, _ = scripted_engine([OtherFlow], [text("sync")])
    response = engine.run_sync("OtherFlow", "hi")
    assert response.success and response.message == "sync"
    doc = SessionDoc.model_validate({"id": "s", "flow": {"name": "F"}})
    SessionLogger(doc).log("Finished batch", operation="batch", count=3)
    entry = doc.to_json_dict()["log"][0]
    assert entry["message"] == "Finished batch" and entry["operation"] == "batch" and entry["count"] == 3
    assert entry["level"] == "log" and entry["timestamp"].endswith("Z")


def test_every_message_type_round_trips_through_its_persisted_form():
    messages = [
        SystemMessage(content="system prompt"),
        HumanMessage(content="hi", id="Step|2026-01-01T00:00:00.000Z|0000000001"),
        AIMessage(content="", id="Step|t|2", tool_calls=[{"name": "t", "args": {"a": [1, {"b": None}]}, "id": "c1"}]),
        ToolMessage(content="done", tool_call_id="c1", name="t", status="error", id="Step|t|3"),
        AIMessage(content="direct", id="Step|t|4", additional_kwargs={"direct": True}),
    ]
    for message in messages:
        restored = from_message_doc(to_message_doc(message))
        assert type(restored) is type(message)
        assert restored.content == message.content and restored.id == message.id
        assert getattr(restored, "tool_calls", None) == getattr(message, "tool_calls", None)
        assert getattr(restored, "tool_call_id", None) == getattr(message, "tool_call_id", None)
        assert getattr(restored, "status", None) == getattr(message, "status", None)
        assert restored.additional_kwargs == message.additional_kwargs


def test_the_adapters_select_the_store_from_the_environment_and_the_engine_defaults_to_memory(monkeypatch, tmp_path):
    monkeypatch.setenv("SESSION_STORE", "sqlite")
    monkeypatch.setenv("SQLITE_PATH", "/tmp/picoflow-test-env/sessions.sqlite")
    engine = FlowEngine(flows=[OtherFlow], providers=ProviderRegistry(override=ScriptedProvider([])))
    # The library core never reads the environment: the deployed and local adapters choose the store.
    script = tmp_path / "script.json"
    script.write_text("[]")
    assert type(engine.session_store).__name__ == "MemorySessionStore"
    env = {"SESSION_STORE": "sqlite", "SQLITE_PATH": "/tmp/picoflow-test-env/sessions.sqlite",
           "PICOFLOW_FLOWS": "tests.support.tiny_flow", "PICOFLOW_SCRIPT": str(script)}
    assert type(build_engine(env).session_store).__name__ == "SQLiteSessionStore"
    with pytest.raises(PicoFlowError, match="No valid session store 'MONGO'"):
        build_engine({**env, "SESSION_STORE": "mongo"})


async def test_input_the_document_cannot_hold_is_refused_before_anything_is_stored():
    engine, _ = scripted_engine([OtherFlow], [])
    deep: dict = {}
    cursor = deep
    for _ in range(5000):
        cursor["x"] = {}
        cursor = cursor["x"]
    for message, config, session in [
        ("\ud800 lone surrogate", None, None),
        ("hi", {"k": "\udfff"}, None),
        ("hi", deep, None),
        ("hi", None, "abc\n"),
    ]:
        response = await engine.run("OtherFlow", message, session, config)
        assert (response.success, response.status_code, response.error_code) == (False, 400, "BAD_REQUEST")
    assert engine.session_store._rows == {}


async def test_a_corrupted_session_can_still_be_ended_and_store_details_stay_private():
    engine, _ = scripted_engine([OtherFlow], [text("a")])
    first = await engine.run("OtherFlow", "hi")
    store = engine.session_store
    revision, flow_name, _ = store._rows[first.session]
    store._rows[first.session] = (revision, flow_name, b"{not json")
    broken = await engine.run("OtherFlow", "hi", first.session)
    assert (broken.status_code, broken.error_code) == (409, "SESSION_FLOW_INVARIANT")
    assert await engine.delete_session(first.session) == {"success": True, "session": first.session}
    assert first.session not in store._rows

    from picoflow.errors import SessionStoreError

    async def failing_load(session_id):
        raise SessionStoreError("load", session_id, "EndpointConnectionError: http://10.1.2.3:8000", status_code=503)

    store.load = failing_load
    failed = await engine.run("OtherFlow", "hi", "a" * 32)
    assert (failed.status_code, failed.error_code) == (503, "SESSION_STORE_ERROR")
    assert "10.1.2.3" not in failed.message


async def test_a_hung_store_cannot_outlast_the_turn_deadline():
    engine, model = scripted_engine([OtherFlow], [text("a"), text("b")])
    first = await engine.run("OtherFlow", "hi")

    async def hung_load(session_id):
        await asyncio.sleep(30)

    engine.session_store.load = hung_load
    started = time.monotonic()
    response = await engine.run("OtherFlow", "hi", first.session, deadline=time.monotonic() + 0.3)
    assert (response.error_code, response.status_code) == ("TURN_DEADLINE", 504)
    assert time.monotonic() - started < 1.0
    assert len(model.calls) == 1
