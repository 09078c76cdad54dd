"""Step-attributed chat messages and their persisted JSON form."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from picoflow.session.document import MessageDoc, ToolCallDoc, format_timestamp

if TYPE_CHECKING:
    from picoflow.step import Step

DIRECT_KEY = "direct"
#: What a step's model is shown on arrival when nothing else opens its turn.
OPENER_TEXT = "Start"
#: The framework's message when it enters a logic step, followed by the step's name.
CONTINUE_PREFIX = "Continue to step:"


def _step_name(owner: Step | str) -> str:
    return owner if isinstance(owner, str) else owner.id


def gen_message_id(owner: Step | str) -> str:
    """``<step name>|<UTC timestamp>|<10 random digits>``: the step prefix attributes the message."""
    stamp = format_timestamp(datetime.now(UTC))
    return f"{_step_name(owner)}|{stamp}|{secrets.randbelow(10**10):010d}"


def message_step(message: BaseMessage | None) -> str | None:
    """The step a message is attributed to, read from its id."""
    if message is None or not isinstance(message.id, str) or "|" not in message.id:
        return None
    return message.id.split("|", 1)[0]


def is_direct(message: BaseMessage) -> bool:
    return isinstance(message, AIMessage) and bool(message.additional_kwargs.get(DIRECT_KEY))


def content_text(content: Any) -> str:
    """Flatten LangChain message content (a string or a list of parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        return "".join(parts)
    return "" if content is None else str(content)


class HumanMessageEx(HumanMessage):
    """A human message whose id names the step that produced it."""

    def __init__(self, owner: Step | str, content: str, **kwargs: Any) -> None:
        kwargs.setdefault("id", gen_message_id(owner))
        kwargs.setdefault("additional_kwargs", {DIRECT_KEY: False})
        super().__init__(content=content, **kwargs)


class AiMessageEx(AIMessage):
    """An AI message whose id names the step that produced it."""

    def __init__(self, owner: Step | str, content: str, **kwargs: Any) -> None:
        kwargs.setdefault("id", gen_message_id(owner))
        kwargs.setdefault("additional_kwargs", {DIRECT_KEY: False})
        super().__init__(content=content, **kwargs)


class ToolMessageEx(ToolMessage):
    """A tool result attributed to the step whose handler produced it."""

    def __init__(self, owner: Step | str, content: str, tool_call_id: str, **kwargs: Any) -> None:
        kwargs.setdefault("id", gen_message_id(owner))
        super().__init__(content=content, tool_call_id=tool_call_id, **kwargs)


class DirectMessage(AIMessage):
    """An AI message returned to the caller verbatim, without another model call."""

    def __init__(self, owner: Step | str, content: Any, **kwargs: Any) -> None:
        text = content if isinstance(content, str) else json.dumps(content)
        kwargs.setdefault("id", gen_message_id(owner))
        extra = dict(kwargs.pop("additional_kwargs", {}))
        extra[DIRECT_KEY] = True
        super().__init__(content=text, additional_kwargs=extra, **kwargs)


_PERSISTED_KWARGS = ("direct", "stopTool")


def to_message_doc(message: BaseMessage) -> MessageDoc:
    """The persisted form of a LangChain message."""
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k in _PERSISTED_KWARGS and v}
    timestamp = message.response_metadata.get("timestamp") if message.response_metadata else None
    fields: dict[str, Any] = {
        "type": message.type,
        "content": message.content,
        "id": message.id,
        "timestamp": timestamp or format_timestamp(datetime.now(UTC)),
        "additional_kwargs": kwargs or None,
    }
    if isinstance(message, ToolMessage):
        fields.update(name=message.name, tool_call_id=message.tool_call_id, status=message.status)
    elif isinstance(message, AIMessage) and message.tool_calls:
        fields["tool_calls"] = [
            ToolCallDoc(name=call["name"], args=call.get("args") or {}, id=call.get("id"))
            for call in message.tool_calls
        ]
    if message.type not in ("system", "human", "ai", "tool"):
        raise ValueError(f"Cannot persist a message of type {message.type!r}.")
    return MessageDoc(**fields)


def from_message_doc(doc: MessageDoc) -> BaseMessage:
    """Rebuild the LangChain message from its persisted form."""
    common: dict[str, Any] = {
        "content": doc.content,
        "id": doc.id,
        "additional_kwargs": dict(doc.additional_kwargs or {}),
        "response_metadata": {"timestamp": doc.timestamp} if doc.timestamp else {},
    }
    if doc.type == "system":
        return SystemMessage(**common)
    if doc.type == "human":
        return HumanMessage(**common)
    if doc.type == "tool":
        return ToolMessage(tool_call_id=doc.tool_call_id, name=doc.name, status=doc.status or "success", **common)
    tool_calls = [
        {"name": call.name, "args": call.args, "id": call.id, "type": "tool_call"} for call in doc.tool_calls or []
    ]
    return AIMessage(tool_calls=tool_calls, **common)
