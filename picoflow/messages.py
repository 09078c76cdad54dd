"""Step-attributed chat messages and their persisted JSON form."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, Protocol, TypeAlias

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, ConfigDict

from picoflow.session.document import MessageDoc, ToolCallDoc, format_timestamp
from picoflow.usage import add_usage as add_usage
from picoflow.usage import usage_from_message as usage_from_message


class Named(Protocol):
    """A step, or a step class: what a message can be attributed to, by its ``id``."""

    #: The step's registered name.
    id: ClassVar[str]


#: Who a message is attributed to: a step, a step class or a step's name.
Owner: TypeAlias = Named | type[Named] | str

DIRECT_KEY = "direct"
#: The ``additional_kwargs`` key (kept in the stored document) saying who wrote a human message.
ORIGIN_KEY = "origin"
#: ``"user"``: the user's words, or an author's message in their name; ``"framework"``: navigation it writes.
MessageOrigin = Literal["user", "framework"]
_ORIGINS = ("user", "framework")
#: What a step's model is shown on arrival when nothing else opens its turn.
OPENER_TEXT = "Start"
#: The framework's message when it enters a logic step, followed by the step's name.
CONTINUE_PREFIX = "Continue to step:"
#: The framework's message after an empty model answer, asking the model to answer properly.
EMPTY_RESPONSE_NUDGE = "Follow system prompt and respond properly."


# Where LangChain's integrations put the provider's reason for ending a reply: OpenAI-compatible and Google
# ``finish_reason``, Anthropic ``stop_reason``, Bedrock's Converse API ``stopReason``.
FINISH_KEYS = ("finish_reason", "stop_reason", "stopReason")


def finish_reason(metadata: Mapping[str, Any] | None) -> str | None:
    """The provider's reason for ending a reply, read from its ``response_metadata``; None when it gave none."""
    for key in FINISH_KEYS:
        value = (metadata or {}).get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _step_name(owner: Owner) -> str:
    return owner if isinstance(owner, str) else owner.id


def gen_message_id(owner: Owner) -> str:
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


def message_origin(message: BaseMessage) -> MessageOrigin | None:
    """Who wrote ``message`` (``"user"`` or ``"framework"``), or None when it does not say (older documents)."""
    origin = message.additional_kwargs.get(ORIGIN_KEY)
    return origin if origin in _ORIGINS else None


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


def as_text(value: Any) -> str:
    """A reply as text: strings as they are, pydantic models and other values as JSON."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return value if isinstance(value, str) else json.dumps(value)


class HumanMessageEx(HumanMessage):
    """A human message whose id names the step that produced it, marked with its ``origin``.

    ``origin="user"`` (the default) is what the user said, or what flow code forwards in their name; decisions
    read these. The framework marks its own navigation messages ``"framework"``. ``content`` is text, or a
    list of parts: text parts and file references (``picoflow.files.refs.with_files``).
    """

    def __init__(
        self, owner: Owner, content: str | Sequence[str | dict[str, Any]], *, origin: MessageOrigin = "user",
        **kwargs: Any,
    ) -> None:
        if origin not in _ORIGINS:
            raise ValueError(f"A message's origin is 'user' or 'framework', not {origin!r}.")
        kwargs.setdefault("id", gen_message_id(owner))
        extra = dict(kwargs.pop("additional_kwargs", None) or {DIRECT_KEY: False})
        extra.setdefault(ORIGIN_KEY, origin)
        parts = content if isinstance(content, str) else list(content)
        super().__init__(content=parts, additional_kwargs=extra, **kwargs)


class AiMessageEx(AIMessage):
    """An AI message whose id names the step that produced it."""

    def __init__(self, owner: Owner, content: str, **kwargs: Any) -> None:
        kwargs.setdefault("id", gen_message_id(owner))
        kwargs.setdefault("additional_kwargs", {DIRECT_KEY: False})
        super().__init__(content=content, **kwargs)


class ToolMessageEx(ToolMessage):
    """A tool result attributed to the step whose handler produced it."""

    # Validation is built on first use: a turn without tool calls never needs it.
    model_config = ConfigDict(defer_build=True)

    def __init__(self, owner: Owner, content: str, tool_call_id: str, **kwargs: Any) -> None:
        kwargs.setdefault("id", gen_message_id(owner))
        super().__init__(content=content, tool_call_id=tool_call_id, **kwargs)


class DirectMessage(AIMessage):
    """An AI message returned to the caller verbatim, without another model call."""

    # Validation is built on first use: a turn without a direct reply never needs it.
    model_config = ConfigDict(defer_build=True)

    def __init__(self, owner: Owner, content: Any, **kwargs: Any) -> None:
        text = content if isinstance(content, str) else json.dumps(content)
        kwargs.setdefault("id", gen_message_id(owner))
        extra = dict(kwargs.pop("additional_kwargs", {}))
        extra[DIRECT_KEY] = True
        super().__init__(content=text, additional_kwargs=extra, **kwargs)


_PERSISTED_KWARGS = (DIRECT_KEY, "stopTool", ORIGIN_KEY)
_PERSISTED_KWARGS_SET = frozenset(_PERSISTED_KWARGS)


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
    if _plain(doc) and _fast_build_ok():
        return _build_fast(doc)
    # Other content, keyword arguments a constructor may read (e.g. provider tool calls), or values changed
    # in place since the document was validated: the constructors decide.
    return _build_validated(doc)


def _plain(doc: MessageDoc) -> bool:
    """Whether ``doc`` holds only values the LangChain constructors keep exactly as they are."""
    kind = doc.type
    kwargs = doc.additional_kwargs
    if (
        type(doc.content) is not str
        or kind not in _FAST_TYPES
        or not _text_or_none(doc.id)
        or not _text_or_none(doc.timestamp)
        or (kwargs and (type(kwargs) is not dict or not _PERSISTED_KWARGS_SET.issuperset(kwargs)))
    ):
        return False
    if kind == "tool":
        status = doc.status
        return type(doc.tool_call_id) is str and _text_or_none(doc.name) and (status is None or (
            type(status) is str and status in _STATUSES))
    if kind == "ai" and doc.tool_calls:
        return type(doc.tool_calls) is list and all(
            type(call) is ToolCallDoc and type(call.name) is str and type(call.args) is dict
            and _text_or_none(call.id)
            for call in doc.tool_calls
        )
    return True


def _text_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _build_validated(doc: MessageDoc) -> BaseMessage:
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


# A stored message was validated when its document was loaded. Rebuilding it through the LangChain constructor
# validates it a second time, which is most of the cost of resuming a session, so text messages are assembled
# directly in the exact form the constructor produces. ``_fast_build_ok`` checks that equivalence once per
# process against the installed LangChain and falls back to the constructors if it ever differs.
_FAST_TYPES: dict[str, type[BaseMessage]] = {
    "system": SystemMessage, "human": HumanMessage, "ai": AIMessage, "tool": ToolMessage,
}
_COMMON_SET = frozenset({"content", "id", "additional_kwargs", "response_metadata"})
_FIELDS_SET = {
    "system": _COMMON_SET,
    "human": _COMMON_SET,
    "ai": _COMMON_SET | {"tool_calls"},
    "tool": _COMMON_SET | {"tool_call_id", "name", "status"},
}
_STATUSES = frozenset({"success", "error"})
_fast_checked: bool | None = None


def _build_fast(doc: MessageDoc) -> BaseMessage:
    kind = doc.type
    timestamp = doc.timestamp
    fields: dict[str, Any] = {
        "content": doc.content,
        "additional_kwargs": dict(doc.additional_kwargs) if doc.additional_kwargs else {},
        "response_metadata": {"timestamp": timestamp} if timestamp else {},
        "type": kind,
        "name": doc.name if kind == "tool" else None,
        "id": doc.id,
    }
    if kind == "ai":
        fields["tool_calls"] = [
            {"name": call.name, "args": dict(call.args), "id": call.id, "type": "tool_call"}
            for call in doc.tool_calls or ()
        ]
        fields["invalid_tool_calls"] = []
        fields["usage_metadata"] = None
    elif kind == "tool":
        fields["tool_call_id"] = doc.tool_call_id
        fields["artifact"] = None
        fields["status"] = doc.status or "success"
    cls = _FAST_TYPES[kind]
    message = cls.__new__(cls)
    _set_dict(message, fields)
    _set_fields_set(message, set(_FIELDS_SET[kind]))
    _set_extra(message, {})
    _set_private(message, None)
    return message


def _slot_setter(name: str) -> Any:
    """The setter of one of pydantic's per-instance slots (what ``model_construct`` assigns)."""
    descriptor = BaseModel.__dict__.get(name)
    if descriptor is not None and hasattr(descriptor, "__set__"):
        return descriptor.__set__
    return lambda instance, value: object.__setattr__(instance, name, value)


_set_dict = _slot_setter("__dict__")
_set_fields_set = _slot_setter("__pydantic_fields_set__")
_set_extra = _slot_setter("__pydantic_extra__")
_set_private = _slot_setter("__pydantic_private__")


def _fast_build_ok() -> bool:
    global _fast_checked
    if _fast_checked is None:
        _fast_checked = _same_as_validated()
    return _fast_checked


def _same_as_validated() -> bool:
    """Whether the direct assembly gives exactly what the constructors give, for every message type."""
    samples = [
        MessageDoc(type="system", content="prompt", timestamp="2026-01-01T00:00:00.000Z"),
        MessageDoc(type="human", content="hi", id="S|t|1", additional_kwargs={DIRECT_KEY: True, ORIGIN_KEY: "user"}),
        MessageDoc(type="ai", content="", id="S|t|2", tool_calls=[ToolCallDoc(name="f", args={"a": 1}, id="c1")]),
        MessageDoc(type="ai", content="text", id="S|t|3", timestamp="2026-01-01T00:00:00.000Z"),
        MessageDoc(type="tool", content="ok", id="S|t|4", tool_call_id="c1", name="f", status="error"),
        MessageDoc(type="tool", content="ok", tool_call_id="c2"),
    ]
    try:
        for sample in samples:
            fast, slow = _build_fast(sample), _build_validated(sample)
            if (
                type(fast) is not type(slow)
                or fast.__dict__ != slow.__dict__
                or list(fast.__dict__) != list(slow.__dict__)
                or fast.__pydantic_fields_set__ != slow.__pydantic_fields_set__
                or fast.__pydantic_extra__ != slow.__pydantic_extra__
                or fast.__pydantic_private__ != slow.__pydantic_private__
            ):
                return False
    except Exception:  # noqa: BLE001 - any surprise means the constructors stay in charge
        return False
    return True


TURN_NOTES_HEADING = "[Notes from the application for this turn, not written by the user]"


class TurnNotesMessage(HumanMessage):
    """Per-turn data sent after the conversation, outside the cached prefix; never stored in memory.

    It travels as a user-side message (the one role every provider accepts at the end of a request),
    headed so that the model does not take it for the user's words.
    """

    def __init__(self, notes: str, **kwargs: Any) -> None:
        super().__init__(content=f"{TURN_NOTES_HEADING}\n{notes}", **kwargs)


SUMMARY_MESSAGE_PREFIX = "Summary of the earlier conversation in this step (older messages were condensed into it):"


def summary_system_message(summary: str, *, message_id: str | None = None) -> SystemMessage:
    """The system message that carries a namespace's summary, placed right after the system prompt."""
    return SystemMessage(content=f"{SUMMARY_MESSAGE_PREFIX}\n{summary}", id=message_id)
