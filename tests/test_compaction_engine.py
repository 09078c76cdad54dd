"""Compaction at save time, idle expiry owned by the flow, and the size limit of a stored document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from langchain_core.messages import SystemMessage
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, stay, tool
from picoflow.conversation.compaction import orphan_tool_messages
from picoflow.messages import from_message_doc
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import encode_document
from picoflow.stores import MemorySessionStore, SessionDoc
from tests.support.engine import text

IDLE_LIMIT_MS = 30 * 60_000


class LookupArgs(BaseModel):
    query: str


class ChatStep(Step):
    def get_prompt(self) -> str:
        return "Help the user."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="lookup", description="Look something up", schema=LookupArgs)]

    @tool
    async def lookup(self, args: dict) -> object:
        return stay(f"found {args['query']}")


class CompactingFlow(Flow):
    def __init__(self) -> None:
        super().__init__()
        self.get_memory().set_summary_model(ModelSelection(provider="summarizer", name="s")).set_summary_config(
            min_messages=8, recent_messages=4
        ).enable_summary("chat")

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [ChatStep(self).use_memory("chat")]


class IdleFlow(CompactingFlow):
    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        restored = await super().on_restore_session_doc(doc)
        if restored is None or self.session_idle_ms(restored) >= IDLE_LIMIT_MS:
            return None
        return restored


class RarelyCompactingFlow(CompactingFlow):
    def __init__(self) -> None:
        super().__init__()
        self.get_memory().set_summary_config(min_messages=40, recent_messages=4)


def tool_turn(index: int) -> list[dict]:
    """One user turn: a tool call, then an answer (two model calls, four stored messages)."""
    return [
        {"content": "", "tool_calls": [{"name": "lookup", "args": {"query": f"q{index}"}, "id": f"c{index}"}],
         "usage": {"input_tokens": 10, "output_tokens": 2}},
        text(f"answer {index}"),
    ]


def engine_for(main: list, summaries: list, store=None, flows=(CompactingFlow,)):
    chat = ScriptedProvider(main, name="scripted")
    summarizer = ScriptedProvider(summaries, name="summarizer")
    engine = FlowEngine(
        flows=list(flows), session_store=store or MemorySessionStore(),
        providers=ProviderRegistry([chat, summarizer]), retry_delay=0,
    )
    return engine, chat, summarizer


async def test_long_tool_conversation_stays_bounded_and_the_summary_reaches_the_model():
    turns = 12
    script = [reply for i in range(turns) for reply in tool_turn(i)]
    summaries = [{"for": "summary", "content": f"summary {i}", "usage": {"input_tokens": 100, "output_tokens": 20}}
                 for i in range(20)]
    engine, chat, summarizer = engine_for(script, summaries)
    session = None
    sizes = []
    for i in range(turns):
        response = await engine.run("CompactingFlow", f"question {i}", session)
        assert response.success, response.message
        session = response.session
        doc = await engine.session_store.load(session)
        space = doc.flow.memory["chat"]
        sizes.append(len(space.messages))
        messages = [from_message_doc(m) for m in space.messages]
        assert isinstance(messages[0], SystemMessage)
        assert orphan_tool_messages(messages) == []
    assert max(sizes) <= 1 + 8 + 5  # system slot, threshold, one turn's growth
    used = len(summarizer.calls)
    assert used >= 3
    assert space.summary == f"summary {used - 1}"
    assert space.summarized_through_id is not None
    # The rolling summary is folded into the next summary request and sent to the chat model.
    assert any("summary 0" in str(m.content) for m in summarizer.calls[1])
    last_request = chat.calls[-1]
    assert isinstance(last_request[1], SystemMessage) and f"summary {used - 2}" in last_request[1].content
    # Summary tokens are billed to the session.
    tokens = doc.tokens
    assert tokens.input_tokens == turns * 20 + used * 100
    assert tokens.output_tokens == turns * 7 + used * 20


class OneModelFlow(CompactingFlow):
    """Chat and summaries from one scripted model, so both kinds of call draw on the same script."""

    def __init__(self) -> None:
        super().__init__()
        self.get_memory().set_summary_model(ModelSelection(provider="scripted", name="s"))


async def run_turns(engine: FlowEngine, flow: str, count: int) -> tuple[list[str], SessionDoc]:
    session, answers = None, []
    for i in range(count):
        response = await engine.run(flow, f"question {i}", session)
        assert response.success, response.message
        session, answers = response.session, [*answers, response.message]
    return answers, await engine.session_store.load(session)


async def test_a_compaction_summary_consumes_only_a_summary_reply():
    # One reply per turn, with the summary scripted first: chat calls pass it by and the summary call takes it.
    script = [{"for": "summary", "content": "the summary"}, *[text(f"answer {i}") for i in range(4)]]
    engine, chat, _ = engine_for(script, [], flows=(OneModelFlow,))

    answers, doc = await run_turns(engine, "OneModelFlow", 4)

    assert answers == [f"answer {i}" for i in range(4)]
    # The third turn brings the history (system slot included) to min_messages = 8.
    assert chat.purposes == ["chat"] * 3 + ["summary", "chat"]
    assert doc.flow.memory["chat"].summary == "the summary"
    assert chat.remaining == 0 and doc.warn == []


async def test_a_summary_call_without_a_summary_reply_fails_and_takes_no_chat_reply():
    engine, chat, _ = engine_for([text(f"answer {i}") for i in range(5)], [], flows=(OneModelFlow,))

    answers, doc = await run_turns(engine, "OneModelFlow", 5)

    assert answers == [f"answer {i}" for i in range(5)]  # nothing shifted
    assert doc.flow.memory["chat"].summary is None and chat.remaining == 0
    # Each turn past the threshold tries again, and each failure names the call.
    assert [w.message.split(": ", 1)[0] for w in doc.warn] == ["Memory compaction skipped"] * 3
    assert "has no reply for model call 4, a summary call:" in doc.warn[0].message
    assert '"for": "summary"' in doc.warn[0].message


async def test_a_broken_summary_model_is_a_warning_and_the_turn_still_saves():
    script = [reply for i in range(5) for reply in tool_turn(i)]
    engine, _, _ = engine_for(script, [{"for": "summary", "error": "summary service down"}] * 10)
    session = None
    for i in range(5):
        response = await engine.run("CompactingFlow", f"q{i}", session)
        assert response.success
        session = response.session
    doc = await engine.session_store.load(session)
    assert doc.revision == 5
    assert doc.flow.memory["chat"].summary is None
    assert any(w.message.startswith("Memory compaction skipped:") for w in doc.warn)


async def age(store: MemorySessionStore, session_id: str, minutes: int) -> None:
    """Make a stored document look ``minutes`` idle (the store stamps saveOn itself, so patch its copy)."""
    doc = await store.load(session_id)
    doc.save_on = datetime.now(UTC) - timedelta(minutes=minutes)
    store._rows[session_id] = (doc.revision, doc.flow.name, encode_document(doc))


async def test_idle_sessions_restart_and_recent_ones_are_restored():
    store = MemorySessionStore()
    engine, _, _ = engine_for([text("a"), text("b"), text("c"), text("d")], [], store=store, flows=(IdleFlow,))
    first = await engine.run("IdleFlow", "hi")
    await age(store, first.session, minutes=5)
    recent = await engine.run("IdleFlow", "still here", first.session)
    assert recent.session == first.session
    await age(store, first.session, minutes=180)
    idle = await engine.run("IdleFlow", "back after lunch", first.session)
    assert idle.success and idle.session != first.session
    old = await store.load(first.session)
    assert old is not None and old.run_status == "running"  # the store applies no policy and keeps it


async def test_documents_near_the_limit_are_compacted_and_oversized_ones_refused():
    store = MemorySessionStore(max_document_bytes=12_000)
    big = "x" * 900
    script = [text(f"{big} {i}") for i in range(12)]
    engine, _, summarizer = engine_for(
        script, [{"for": "summary", "content": "short summary"}] * 10, store=store, flows=(RarelyCompactingFlow,)
    )
    session = None
    for i in range(6):
        response = await engine.run("RarelyCompactingFlow", f"{big} question {i}", session)
        assert response.success, response.message
        session = response.session
    assert len(summarizer.calls) >= 1  # forced: 13 messages never reach the ordinary threshold of 40
    assert store.stored_size(await store.load(session)) <= 12_000

    before = await store.load(session)
    huge = await engine.run("RarelyCompactingFlow", "y" * 20_000, session)
    assert (huge.success, huge.status_code, huge.error_code) == (False, 413, "SESSION_TOO_LARGE")
    after = await store.load(session)
    assert after.model_dump_json() == before.model_dump_json()
