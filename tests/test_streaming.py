"""FlowEngine.stream: the event contract of a streamed turn, its failures, and run() as the stream drained."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, tool
from picoflow.authoring.recovery import DEFAULT_STALL_MS, resolve_call_policy
from picoflow.events import TurnEvent
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.echo_flows import EchoFlow, JsonFlow
from tests.support.engine import call, scripted_engine, text

ANSWER = "The blue room is free on Friday and costs ninety euros a night."


class FindRoom(BaseModel):
    day: str


class LookupStep(Step):
    def get_prompt(self) -> str:
        return "Look rooms up before answering."

    def use_tools(self) -> list[str]:
        return ["find_room"]

    @tool
    async def find_room(self, args: dict[str, Any]) -> Any:
        return None


class LookupFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o", retry_attempts=2)

    def define_tools(self) -> list[Any]:
        return [ToolSpec(name="find_room", description="Find a free room.", schema=FindRoom)]

    def define_steps(self) -> list[Step]:
        return [LookupStep(self)]


class QuickFlow(EchoFlow):
    """EchoFlow whose model attempts time out after 300 ms."""

    id = "QuickFlow"

    def config_llm_call_policy(self) -> dict[str, Any]:
        return {"timeout_ms": 300}


async def collect(engine: FlowEngine, *args: Any, **kwargs: Any) -> list[TurnEvent]:
    return [event async for event in engine.stream(*args, **kwargs)]


def shown_after_last_reset(events: list[TurnEvent]) -> str:
    shown = ""
    for event in events:
        if event.event == "reset":
            shown = ""
        elif event.event == "delta":
            shown += event.data["text"]
    return shown


def assert_contract(events: list[TurnEvent]) -> TurnEvent:
    """Exactly one final event, last; every event's data is JSON."""
    assert [event.final for event in events].count(True) == 1
    assert events[-1].final
    for event in events:
        json.dumps(event.data)
    return events[-1]


def test_a_plain_reply_streams_in_pieces_then_commits() -> None:
    engine, provider = scripted_engine([EchoFlow], [text(ANSWER)])
    events = asyncio.run(collect(engine, "EchoFlow", "Is a room free on Friday?"))
    final = assert_contract(events)
    deltas = [event.data["text"] for event in events if event.event == "delta"]
    assert len(deltas) > 3  # word by word, not the whole reply at once
    assert final.event == "committed"
    assert final.data == {"success": True, "completed": False, "message": ANSWER, "session": final.data["session"],
                          "contentType": "text/plain"}
    assert shown_after_last_reset(events) == final.data["message"]
    assert len(provider.calls) == 1


def test_run_is_the_stream_drained() -> None:
    engine, _ = scripted_engine([EchoFlow], [text(ANSWER), text(ANSWER)])
    streamed = asyncio.run(collect(engine, "EchoFlow", "Hi"))[-1].response
    ran = asyncio.run(engine.run("EchoFlow", "Hi"))
    assert streamed is not None
    assert (ran.success, ran.message, ran.content_type) == (streamed.success, streamed.message, streamed.content_type)
    assert ran.tokens == streamed.tokens


def test_text_before_a_tool_call_is_reset_and_tools_are_named() -> None:
    replies = [
        {**call(("find_room", {"day": "Friday"})), "content": "Let me check the calendar."},
        text(ANSWER),
    ]
    engine, _ = scripted_engine([LookupFlow], replies)
    events = asyncio.run(collect(engine, "LookupFlow", "Is a room free on Friday?"))
    final = assert_contract(events)
    names = [event.event for event in events]
    first_reset = names.index("reset")
    assert "".join(e.data["text"] for e in events[:first_reset] if e.event == "delta") == "Let me check the calendar."
    tools = [event.data for event in events if event.event == "tool"]
    assert tools == [{"name": "find_room"}]  # the name only, never the arguments
    assert names.index("tool") > first_reset
    assert final.event == "committed"
    assert shown_after_last_reset(events) == final.data["message"] == ANSWER


def test_a_json_reply_arrives_whole_in_the_committed_event() -> None:
    engine, _ = scripted_engine([JsonFlow], [text('{"rooms": ["blue", "green"]}')])
    events = asyncio.run(collect(engine, "JsonFlow", "List rooms"))
    final = assert_contract(events)
    assert [event.event for event in events] == ["committed"]
    assert final.data["contentType"] == "application/json"
    assert json.loads(final.data["message"]) == {"rooms": ["blue", "green"]}


def test_a_model_failing_mid_stream_aborts_and_leaves_the_session_unchanged() -> None:
    secret = "upstream said: key sk-live-123 rejected at https://models.internal.example/v1"
    engine, _ = scripted_engine([EchoFlow], [
        text("Hello."),
        {"content": "The blue room is", "error": secret, "status": 400, "break_after": 2},
    ])
    first = asyncio.run(engine.run("EchoFlow", "Hi"))
    store = engine.session_store
    before = asyncio.run(store.load(first.session))
    events = asyncio.run(collect(engine, "EchoFlow", "Is a room free?", first.session))
    final = assert_contract(events)
    assert [event.event for event in events] == ["delta", "delta", "reset", "aborted"]
    assert final.data["code"] == "MODEL_UNAVAILABLE"
    assert set(final.data) == {"success", "completed", "message", "session", "code", "requestId"}
    everything = json.dumps([event.data for event in events])
    for leak in ("sk-live-123", "models.internal.example", "upstream said"):
        assert leak not in everything
    after = asyncio.run(store.load(first.session))
    assert after.revision == before.revision
    assert after.flow.memory == before.flow.memory


def test_a_retried_partial_answer_is_reset_before_the_new_one() -> None:
    engine, provider = scripted_engine([EchoFlow], [
        {"content": "The red room", "error": "connection reset", "status": 503, "break_after": 2},
        text(ANSWER),
    ])
    events = asyncio.run(collect(engine, "EchoFlow", "Is a room free?"))
    final = assert_contract(events)
    names = [event.event for event in events]
    assert names[:3] == ["delta", "delta", "reset"]
    assert final.event == "committed"
    assert shown_after_last_reset(events) == final.data["message"] == ANSWER
    assert len(provider.calls) == 2


def test_a_stall_between_chunks_counts_against_the_call_timeout() -> None:
    stalled = {"content": "The blue room is free", "chunk_delay": 5.0}
    provider = ScriptedProvider([text("Hello."), stalled, stalled, stalled])
    engine = FlowEngine([QuickFlow], MemorySessionStore(), ProviderRegistry(override=provider), retry_delay=0)
    first = asyncio.run(engine.run("QuickFlow", "Hi"))
    revision = asyncio.run(engine.session_store.load(first.session)).revision
    events = asyncio.run(asyncio.wait_for(collect(engine, "QuickFlow", "Room?", first.session), 10))
    final = assert_contract(events)
    assert final.event == "aborted" and final.data["code"] == "MODEL_TIMEOUT"
    assert events[0].event == "delta" and "reset" in [event.event for event in events]
    assert asyncio.run(engine.session_store.load(first.session)).revision == revision


class StallingFlow(EchoFlow):
    """EchoFlow whose streamed replies may pause 200 ms between chunks, with no limit on a whole attempt."""

    id = "StallingFlow"

    def config_llm_call_policy(self) -> dict[str, Any]:
        return {"stall_ms": 200}


def test_by_default_a_streamed_call_may_stall_ten_seconds_and_a_policy_changes_that() -> None:
    assert DEFAULT_STALL_MS == 10_000
    assert resolve_call_policy({}, {}).stall_ms == 10_000
    assert resolve_call_policy({"stall_ms": 200}, {}).stall_ms == 200
    assert resolve_call_policy({"stall_ms": 200}, {"stall_ms": None}).stall_ms is None
    with pytest.raises(Exception, match="stall_ms must be a positive integer"):
        resolve_call_policy({"stall_ms": 0}, {})


def test_a_stall_beyond_the_stall_limit_ends_the_attempt_with_model_timeout() -> None:
    # Each chunk may take 200 ms: the first reply's words come 0.5 s apart, the retry's without a pause.
    provider = ScriptedProvider([{"content": "The blue room is free", "chunk_delay": 0.5}, text(ANSWER)])
    engine = FlowEngine([StallingFlow], MemorySessionStore(), ProviderRegistry(override=provider), retry_delay=0)
    events = asyncio.run(asyncio.wait_for(collect(engine, "StallingFlow", "Room?"), 10))
    final = assert_contract(events)
    assert final.event == "committed" and final.data["message"] == ANSWER
    assert [event.event for event in events][:2] == ["delta", "reset"]
    assert len(provider.calls) == 2

    stalled = {"content": "The blue room is free", "chunk_delay": 0.5}
    provider = ScriptedProvider([stalled] * 3)
    engine = FlowEngine([StallingFlow], MemorySessionStore(), ProviderRegistry(override=provider), retry_delay=0)
    final = assert_contract(asyncio.run(asyncio.wait_for(collect(engine, "StallingFlow", "Room?"), 10)))
    assert final.event == "aborted" and final.data["code"] == "MODEL_TIMEOUT"


def test_a_stream_without_a_finish_reason_is_a_failed_call_not_a_reply() -> None:
    cut = {"content": "Abraham Lincoln was the", "response_metadata": {"finish_reason": None}}
    engine, provider = scripted_engine([EchoFlow], [cut, text(ANSWER)])
    events = asyncio.run(collect(engine, "EchoFlow", "Who was Lincoln?"))
    final = assert_contract(events)
    assert final.event == "committed" and final.data["message"] == ANSWER
    assert len(provider.calls) == 2

    engine, provider = scripted_engine([EchoFlow], [cut] * 3)
    final = assert_contract(asyncio.run(collect(engine, "EchoFlow", "Who was Lincoln?")))
    assert final.event == "aborted" and final.data["code"] == "MODEL_UNAVAILABLE"
    assert "Lincoln" not in json.dumps(final.data)


def test_a_lost_race_at_the_write_aborts_after_the_deltas() -> None:
    store = MemorySessionStore()
    slow = ScriptedProvider([text("Hello."), {"content": ANSWER, "delay": 0.3}])
    fast = ScriptedProvider([text("Quick answer.")])
    engine = FlowEngine([EchoFlow], store, ProviderRegistry(override=slow), retry_delay=0)
    rival = FlowEngine([EchoFlow], store, ProviderRegistry(override=fast), retry_delay=0)

    async def race() -> list[TurnEvent]:
        first = await engine.run("EchoFlow", "Hi")
        streamed = asyncio.ensure_future(collect(engine, "EchoFlow", "Room?", first.session))
        await asyncio.sleep(0.1)
        assert (await rival.run("EchoFlow", "Other tab", first.session)).success
        return await streamed

    events = asyncio.run(race())
    final = assert_contract(events)
    assert "".join(event.data["text"] for event in events if event.event == "delta") == ANSWER
    assert final.event == "aborted" and final.data["code"] == "SESSION_CONFLICT"


def test_a_keyed_retry_of_a_committed_turn_answers_one_committed_event_without_a_model_call() -> None:
    engine, provider = scripted_engine([EchoFlow], [text(ANSWER)])
    first = asyncio.run(collect(engine, "EchoFlow", "Room?", idempotency_key="b6f0c7a2-5d1e-4f7a-9c3b-2e8d1a4f6b90"))
    calls = len(provider.calls)
    again = asyncio.run(collect(engine, "EchoFlow", "Room?", idempotency_key="b6f0c7a2-5d1e-4f7a-9c3b-2e8d1a4f6b90"))
    assert [event.event for event in again] == ["committed"]
    assert again[0].data == first[-1].data
    assert len(provider.calls) == calls


def test_streamed_usage_is_counted() -> None:
    engine, _ = scripted_engine([EchoFlow], [text(ANSWER, input_tokens=40, output_tokens=12)])
    final = asyncio.run(collect(engine, "EchoFlow", "Hi"))[-1]
    assert final.response is not None and final.response.tokens is not None
    assert (final.response.tokens.input_tokens, final.response.tokens.output_tokens) == (40, 12)
    doc = asyncio.run(engine.session_store.load(final.data["session"]))
    assert (doc.tokens.input_tokens, doc.tokens.output_tokens) == (40, 12)


def test_a_reader_that_stops_reading_does_not_stop_the_turn() -> None:
    engine, _ = scripted_engine([EchoFlow], [text("Hello."), {**text(ANSWER), "chunk_delay": 0.01}])

    async def leave_early() -> tuple[int, int]:
        first = await engine.run("EchoFlow", "Hi")
        before = (await engine.session_store.load(first.session)).revision
        stream = engine.stream("EchoFlow", "Room?", first.session)
        assert (await anext(stream)).event == "delta"
        await stream.aclose()
        return before, (await engine.session_store.load(first.session)).revision

    before, after = asyncio.run(leave_early())
    assert after == before + 1


@pytest.mark.parametrize("flow_name", ["", "NoSuchFlow"])
def test_a_refused_request_streams_only_its_aborted_event(flow_name: str) -> None:
    engine, _ = scripted_engine([EchoFlow], [])
    events = asyncio.run(collect(engine, flow_name, "Hi"))
    assert [event.event for event in events] == ["aborted"]
    assert events[0].data["success"] is False
