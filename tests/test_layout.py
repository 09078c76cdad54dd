"""How far one ordinary turn travels through the framework: HotelFlow's "search" turn, traced in-process.

The turn (one ``capture_choices`` tool call answered by the MCP search server, then a text reply, and a rolling
summary of the history) runs on the memory store with a chat model defined here, so the files counted are the
framework's own. ``sys.setprofile`` records every Python call into ``picoflow/``: the files entered, the distinct
pairs of files that call each other (and the caller -> callee directions), and the calls between ``flow.py`` and
``step.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import picoflow
from flows.hotel import HotelFlow
from picoflow import FlowEngine
from picoflow.context import call_purpose
from picoflow.models.registry import ModelProvider, ModelSelection, ProviderRegistry
from picoflow.stores import MemorySessionStore

CONVERSATION = json.loads((Path(__file__).parents[1] / "flows" / "hotel" / "conversation.json").read_text())
SEARCH_TURN = 7
PACKAGE = str(Path(picoflow.__file__).parent) + "/"


class ReplayModel(BaseChatModel):
    """Answers each call with the conversation's next reply for its purpose (a chat reply or a summary)."""

    replies: dict[str, list[dict[str, Any]]]

    @property
    def _llm_type(self) -> str:
        return "replay"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ReplayModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        reply = self.replies["summary" if call_purpose.get() == "summary" else "chat"].pop(0)
        calls = [{"name": c["name"], "args": c["args"], "id": c["id"]} for c in reply.get("tool_calls", [])]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(reply.get("content", ""), tool_calls=calls))])


class ReplayProvider(ModelProvider):
    name = "replay"

    def __init__(self, model: ReplayModel) -> None:
        self.model = model

    def validate(self, selection: ModelSelection) -> None:
        return None

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        return self.model


def _replies() -> dict[str, list[dict[str, Any]]]:
    replies: dict[str, list[dict[str, Any]]] = {"chat": [], "summary": []}
    for turn in CONVERSATION["turns"]:
        for reply in turn["replies"]:
            replies["summary" if reply.get("for") == "summary" else "chat"].append(reply)
    return replies


def _trace_search_turn() -> tuple[set[str], Counter[tuple[str, str]], int, str]:
    engine = FlowEngine([HotelFlow], MemorySessionStore(),
                        ProviderRegistry(override=ReplayProvider(ReplayModel(replies=_replies()))))
    files: set[str] = set()
    edges: Counter[tuple[str, str]] = Counter()
    between = Counter[str]()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        callee = frame.f_code.co_filename
        if event != "call" or not callee.startswith(PACKAGE):
            return
        files.add(callee[len(PACKAGE):])
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller.startswith(PACKAGE) and caller != callee:
            pair = (caller[len(PACKAGE):], callee[len(PACKAGE):])
            edges[pair] += 1
            if set(pair) == {"flow.py", "step.py"}:
                between["calls"] += 1

    async def converse() -> str:
        session = None
        message = ""
        for index, turn in enumerate(CONVERSATION["turns"][: SEARCH_TURN + 1]):
            if index == SEARCH_TURN:
                sys.setprofile(profile)
            try:
                response = await engine.run("HotelFlow", turn["user"], session, CONVERSATION["config"])
            finally:
                sys.setprofile(None)
            assert response.success, response.message
            session, message = response.session, response.message
        return message

    message = asyncio.run(converse())
    return files, edges, between["calls"], message


def test_the_search_turn_crosses_few_framework_files() -> None:
    files, edges, flow_step_calls, message = _trace_search_turn()

    chat = [reply for reply in CONVERSATION["turns"][SEARCH_TURN]["replies"] if reply.get("for") != "summary"]
    assert [bool(reply.get("tool_calls")) for reply in chat] == [True, False]  # one tool call, then the answer
    assert message == chat[-1]["content"]
    linked = {frozenset(pair) for pair in edges}
    print(f"\nsearch turn: {len(files)} files of picoflow/ entered, {len(linked)} pairs of files calling each other "
          f"({len(edges)} caller -> callee directions), {sum(edges.values())} cross-file calls, "
          f"{flow_step_calls} calls between flow.py and step.py")
    print("files:", ", ".join(sorted(files)))
    # The engine and the turn's event stream (events.py) are one more file and one more pair than before streaming.
    assert len(files) <= 13, sorted(files)
    assert len(linked) <= 26, sorted(edges)
    assert len(edges) <= 29, sorted(edges)  # keeps the directed figure from growing back
    assert flow_step_calls <= 10
