"""When the first summary is written, counted as the original's memory-compaction tutorial counts it.

The tutorial's rule: ``min_messages`` counts the system-prompt slot at index 0, a namespace is compacted at
the end of the turn in which its history has reached ``min_messages``, and the cut keeps the newest
``recent_messages`` messages verbatim.
"""

from __future__ import annotations

import pytest

from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.messages import from_message_doc
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.engine import text

TURNS = 12


class ChatStep(Step):
    def get_prompt(self) -> str:
        return "Help the user."


def chat_flow(min_messages: int, recent_messages: int, *, compact: bool) -> type[Flow]:
    class PlainChatFlow(Flow):
        def __init__(self) -> None:
            super().__init__()
            memory = self.get_memory().set_summary_model(ModelSelection(provider="summarizer", name="s"))
            memory.set_summary_config(min_messages=min_messages, recent_messages=recent_messages)
            if compact:
                memory.enable_summary("chat")

        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [ChatStep(self).use_memory("chat")]

    return PlainChatFlow


async def histories(min_messages: int, recent_messages: int, *, compact: bool) -> list[tuple[list[str], str | None]]:
    """The namespace's message texts (system slot included) and its summary after each of ``TURNS`` turns."""
    flow = chat_flow(min_messages, recent_messages, compact=compact)
    engine = FlowEngine(
        flows=[flow],
        session_store=MemorySessionStore(),
        providers=ProviderRegistry([
            ScriptedProvider([text(f"answer {i}") for i in range(TURNS)], name="scripted"),
            ScriptedProvider([{"for": "summary", "content": f"summary {i}"} for i in range(TURNS)], name="summarizer"),
        ]),
        retry_delay=0,
    )
    session, seen = None, []
    for i in range(TURNS):
        response = await engine.run("PlainChatFlow", f"message {i}", session)
        assert response.success, response
        session = response.session
        space = (await engine.session_store.load(session)).flow.memory["chat"]
        seen.append(([str(from_message_doc(m).content) for m in space.messages], space.summary))
    return seen


@pytest.mark.parametrize(("min_messages", "recent_messages", "first_turn"), [(8, 4, 3), (12, 6, 5), (16, 8, 7)])
async def test_the_first_summary_is_written_in_the_turn_the_history_reaches_min_messages(
    min_messages: int, recent_messages: int, first_turn: int
) -> None:
    plain = await histories(min_messages, recent_messages, compact=False)
    compacted = await histories(min_messages, recent_messages, compact=True)

    # The tutorial's count, applied to the same conversation left uncompacted.
    reached = next(turn for turn, (messages, _) in enumerate(plain, 1) if len(messages) >= min_messages)
    summarised = next(turn for turn, (_, summary) in enumerate(compacted, 1) if summary is not None)
    assert summarised == reached == first_turn
    assert all(summary is None for _, summary in compacted[: summarised - 1])

    # The system slot and the newest recent_messages of that history stay verbatim.
    before = plain[reached - 1][0]
    assert compacted[reached - 1][0] == [before[0], *before[-recent_messages:]]
    assert compacted[reached - 1][1] == "summary 0"
