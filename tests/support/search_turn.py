"""HotelFlow's "search" turn replayed in-process from its conversation.json, with a profiler on that turn only.

The turn (one ``capture_choices`` tool call answered by the MCP search server, then a text reply, and a rolling
summary of the history) runs on the memory store with a chat model defined here, so the files a profiler sees
are the framework's own.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from flows.hotel import HotelFlow
from picoflow import FlowEngine
from picoflow.deadline import current_scope
from picoflow.models.registry import ModelProvider, ModelSelection, ProviderRegistry
from picoflow.stores import MemorySessionStore

CONVERSATION = json.loads((Path(__file__).parents[2] / "flows" / "hotel" / "conversation.json").read_text())
SEARCH_TURN = 7


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
        reply = self.replies["summary" if current_scope().purpose == "summary" else "chat"].pop(0)
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


def replies() -> dict[str, list[dict[str, Any]]]:
    """The conversation's model replies, chat and summary apart, in order."""
    found: dict[str, list[dict[str, Any]]] = {"chat": [], "summary": []}
    for turn in CONVERSATION["turns"]:
        for reply in turn["replies"]:
            found["summary" if reply.get("for") == "summary" else "chat"].append(reply)
    return found


def run_search_turn(profile: Callable[[Any, str, Any], Any]) -> str:
    """Replay the conversation up to the search turn, that turn under ``sys.setprofile(profile)``; its reply."""
    engine = FlowEngine([HotelFlow], MemorySessionStore(),
                        ProviderRegistry(override=ReplayProvider(ReplayModel(replies=replies()))))

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

    return asyncio.run(converse())
