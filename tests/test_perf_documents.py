"""The fast paths of loading a session (JSON parsing, message hydration) give exactly what the slow ones give."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from picoflow.messages import _build_validated, from_message_doc, to_message_doc
from picoflow.session.document import (
    MessageDoc,
    NamespaceDoc,
    SessionDoc,
    ToolCallDoc,
    decode_document,
    encode_document,
    parse_json,
)

TEXT = st.text(max_size=12)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6
)
# Values of the right types, of near-miss types, and of wrong types for every field.
ANY_VALUE = st.none() | st.integers() | st.floats(allow_nan=False) | TEXT | st.lists(JSON_SCALARS, max_size=2) | (
    st.dictionaries(TEXT, JSON_SCALARS, max_size=2)
)
VALID_CALLS = st.lists(
    st.fixed_dictionaries(
        {"name": TEXT},
        optional={"args": st.dictionaries(TEXT, JSON_VALUES, max_size=3), "id": st.none() | TEXT},
    ),
    max_size=3,
)
VALID_MESSAGES = st.fixed_dictionaries(
    {"type": st.sampled_from(["system", "human", "ai", "tool"])},
    optional={
        "content": TEXT,
        "id": st.none() | TEXT,
        "timestamp": st.none() | TEXT,
        "name": st.none() | TEXT,
        "tool_call_id": st.none() | TEXT,
        "status": st.sampled_from(["success", "error"]) | st.none(),
        "tool_calls": st.none() | VALID_CALLS,
        "additional_kwargs": st.none() | st.dictionaries(TEXT | st.sampled_from(["direct", "stopTool"]),
                                                         JSON_VALUES, max_size=3),
    },
)
KEYS = st.sampled_from(
    ["type", "content", "id", "timestamp", "name", "tool_call_id", "status", "tool_calls", "additional_kwargs",
     "legacy"]
)
NEAR_MISSES = (
    ANY_VALUE
    | st.sampled_from(["bot", "failed", "", ("a",)])
    | st.lists(st.fixed_dictionaries({}, optional={"name": ANY_VALUE, "args": ANY_VALUE, "id": ANY_VALUE,
                                                  "extra": JSON_SCALARS}), max_size=2)
    | st.dictionaries(st.integers(), JSON_SCALARS, min_size=1, max_size=2)
    | st.lists(JSON_VALUES, max_size=2)
)


@st.composite
def _near_miss(draw: st.DrawFn) -> dict:
    """A valid message with one field replaced (or added, or removed)."""
    item = dict(draw(VALID_MESSAGES))
    key = draw(KEYS)
    if draw(st.booleans()) and key in item:
        del item[key]
    else:
        item[key] = draw(NEAR_MISSES)
    return item


MESSAGES = VALID_MESSAGES | _near_miss()


def _state(model: object) -> tuple:
    return (
        type(model),
        dict(model.__dict__),
        list(model.__dict__),
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


def _deep_state(message: MessageDoc) -> tuple:
    calls = [_state(call) for call in message.tool_calls or []]
    return _state(message), calls


@settings(max_examples=1500, deadline=None)
@given(MESSAGES)
def test_a_stored_message_is_hydrated_exactly_as_the_constructors_hydrate_it(item: dict) -> None:
    try:
        doc = MessageDoc.model_validate(item)
    except ValueError:
        return
    try:
        slow = _build_validated(doc)
    except ValueError:
        with pytest.raises(ValueError):
            from_message_doc(doc)
        return
    fast = from_message_doc(doc)
    assert _state(fast) == _state(slow)
    assert fast == slow and repr(fast) == repr(slow)
    assert fast.model_dump() == slow.model_dump()
    assert to_message_doc(fast).model_dump(exclude={"timestamp"}) == to_message_doc(slow).model_dump(
        exclude={"timestamp"}
    )


JSON_TEXTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
).map(lambda value: json.dumps(value, ensure_ascii=False))


@settings(max_examples=800, deadline=None)
@given(JSON_TEXTS | st.text(max_size=20) | st.binary(max_size=20))
def test_parsing_a_stored_document_gives_what_json_loads_gives(text: str | bytes) -> None:
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError) as exc:
        try:
            parse_json(text)
        except type(exc):
            return
        raise AssertionError(f"parse_json accepted what json.loads refused: {text!r}") from None
    assert repr(parse_json(text)) == repr(expected)
    encoded = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    with contextlib.suppress(ValueError):
        assert repr(parse_json(encoded)) == repr(json.loads(encoded))


def test_json_edge_cases_follow_json_loads() -> None:
    for text in ['"\\ud800"', '{"a": 1, "a": 2}', "1e400", "-0.0", "NaN", "[1.5e-320]", "12345678901234567890123"]:
        assert repr(parse_json(text)) == repr(json.loads(text))
    with pytest.raises(ValueError):
        parse_json("\ufeff{}")  # json.loads refuses a byte order mark in text
    assert repr(parse_json(b"\xef\xbb\xbf{}")) == repr(json.loads(b"\xef\xbb\xbf{}"))


def test_a_tool_message_without_call_id_is_still_refused_with_its_reason() -> None:
    doc = {"id": "s", "flow": {"name": "F", "memory": {"ns": {"messages": [{"type": "tool", "content": "x"}]}}}}
    try:
        SessionDoc.model_validate(doc)
    except ValueError as exc:
        assert "tool_call_id" in str(exc)
    else:
        raise AssertionError("a tool message without tool_call_id was accepted")


def test_stored_messages_round_trip_through_the_fast_paths() -> None:
    messages = [
        SystemMessage(content="prompt"),
        HumanMessage(content="hi", id="S|2026-01-01T00:00:00.000Z|0000000001"),
        AIMessage(content="", id="S|t|2", tool_calls=[{"name": "f", "args": {"a": [1, 2.5, None]}, "id": "c1"}]),
        ToolMessage(content="ok", tool_call_id="c1", name="f", status="error", id="S|t|3"),
        AIMessage(content="done", id="S|t|4", additional_kwargs={"direct": True}),
    ]
    docs = [to_message_doc(m) for m in messages]
    doc = SessionDoc.model_validate({"id": "s", "flow": {"name": "F", "memory": {"ns": {"messages": [
        d.model_dump(mode="json") for d in docs]}}}})
    raw = encode_document(doc)
    loaded = decode_document(raw, 0)
    assert encode_document(loaded) == raw
    for stored, original in zip(loaded.flow.memory["ns"].messages, docs, strict=True):
        assert stored == original
        assert _deep_state(stored) == _deep_state(MessageDoc.model_validate(original.model_dump(mode="json")))
        fast, slow = from_message_doc(stored), _build_validated(stored)
        assert fast == slow and fast.__dict__ == slow.__dict__ and type(fast) is type(slow)
        assert fast.__pydantic_fields_set__ == slow.__pydantic_fields_set__


def test_provider_tool_calls_kept_in_keyword_arguments_are_still_parsed_by_the_constructor() -> None:
    raw_calls = [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    doc = MessageDoc(type="ai", content="", id="S|t|9", additional_kwargs={"tool_calls": raw_calls, "direct": True})
    message = from_message_doc(doc)
    assert message == _build_validated(doc)
    assert message.tool_calls == [{"name": "f", "args": {"a": 1}, "id": "c9", "type": "tool_call"}]


def test_a_stored_message_changed_in_place_is_left_to_the_constructors() -> None:
    doc = MessageDoc(type="tool", content="ok", tool_call_id="c1", name="f")
    doc.tool_call_id = None  # no assignment validation: only the LangChain constructor refuses this
    with pytest.raises(ValueError):
        from_message_doc(doc)
    doc = MessageDoc(type="tool", content="ok", tool_call_id="c1", name="f")
    doc.tool_call_id, doc.status = 7, ["odd"]
    with pytest.raises(ValueError):
        from_message_doc(doc)
    doc = MessageDoc(type="ai", content="", tool_calls=[ToolCallDoc(name="f", args={"a": 1}, id="c")])
    doc.tool_calls[0].args = None
    with pytest.raises(ValueError):
        from_message_doc(doc)


def test_legacy_object_content_is_still_normalised() -> None:
    item = {"type": "ai", "content": {"answer": 42}}
    doc = NamespaceDoc.model_validate({"messages": [item]})
    assert doc.messages[0].content == json.dumps({"answer": 42})
    assert isinstance(doc.messages[0], MessageDoc) and isinstance(ToolCallDoc(name="x"), ToolCallDoc)
