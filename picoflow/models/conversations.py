"""The rules a chat service holds a conversation to (roles in order, tool calls answered before anything else,
no empty turns), checked the way the service would before it accepts a request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from picoflow.errors import IllegalConversationError


def _shape(message: BaseMessage | Mapping[str, Any]) -> tuple[str, Any, list[str], str | None]:
    """(role, content, ids of the tool calls it makes, id of the call it answers)."""
    if isinstance(message, Mapping):
        calls = [str(call.get("id")) for call in message.get("tool_calls") or []]
        return str(message.get("role")), message.get("content"), calls, message.get("tool_call_id")
    if isinstance(message, SystemMessage):
        return "system", message.content, [], None
    if isinstance(message, HumanMessage):
        return "user", message.content, [], None
    if isinstance(message, AIMessage):
        return "assistant", message.content, [str(call.get("id")) for call in message.tool_calls], None
    if isinstance(message, ToolMessage):
        return "tool", message.content, [], message.tool_call_id
    return type(message).__name__, message.content, [], None


def conversation_problems(messages: Sequence[BaseMessage | Mapping[str, Any]]) -> list[str]:
    """Every rule ``messages`` break, in order; empty when the service would accept them."""
    problems: list[str] = []
    if not messages:
        return ["the request has no messages"]
    pending: list[str] = []  # tool call ids still waiting for their results
    seen_other = False
    for index, message in enumerate(messages):
        role, content, calls, answers = _shape(message)
        where = f"message {index} ({role})"
        if role != "tool" and pending:
            problems.append(f"{where} comes before the results of tool calls {', '.join(pending)}")
            pending = []
        if role == "system":
            if seen_other:
                problems.append(f"{where} follows the conversation; system messages lead it")
        elif role == "user":
            seen_other = True
            if not _has_text(content):
                problems.append(f"{where} has empty content")
        elif role == "assistant":
            seen_other = True
            if not calls and not _has_text(content):
                problems.append(f"{where} has neither content nor tool calls")
            if len(set(calls)) != len(calls):
                problems.append(f"{where} repeats a tool call id")
            pending = list(calls)
        elif role == "tool":
            seen_other = True
            if answers not in pending:
                problems.append(f"{where} answers {answers!r}, which no preceding assistant message is waiting for")
            else:
                pending.remove(answers)
        else:
            problems.append(f"{where} has an unknown role")
    if pending:
        problems.append(f"the request ends before the results of tool calls {', '.join(pending)}")
    return problems


def check_conversation(messages: Sequence[BaseMessage | Mapping[str, Any]]) -> None:
    """Raise ``IllegalConversationError`` naming the first broken rule, if any."""
    problems = conversation_problems(messages)
    if problems:
        raise IllegalConversationError(f"The chat service would refuse this request: {problems[0]}.")


def _has_text(content: Any) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    return bool(content)
