from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from picoflow.conversation.compaction import (
    CompactionResult,
    choose_cut,
    compact_history,
    orphan_tool_messages,
)
from picoflow.conversation.memory import SummaryConfig
from picoflow.errors import CompactionError
from picoflow.messages import summary_system_message

USAGE = {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}


class RecordingModel(BaseChatModel):
    """Returns a fixed reply (or raises) and remembers every request it received."""

    reply: str = "SUMMARY: user wants a hotel in Lisbon for 2 adults."
    error: str | None = None
    calls: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "recording-fake"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any):
        self.calls.append(list(messages))
        if self.error is not None:
            raise RuntimeError(self.error)
        message = AIMessage(content=self.reply, usage_metadata=USAGE)
        return ChatResult(generations=[ChatGeneration(message=message)])


class Ids:
    def __init__(self) -> None:
        self.counter = 0

    def __call__(self) -> str:
        self.counter += 1
        return f"ExploreStep|2026-02-11T09:14:{self.counter % 60:02d}.113Z|{4821990000 + self.counter}"


def human(ids: Ids, text: str) -> HumanMessage:
    return HumanMessage(content=text, id=ids())


def ai(ids: Ids, text: str) -> AIMessage:
    return AIMessage(content=text, id=ids())


def ai_calls(ids: Ids, *names: str) -> AIMessage:
    calls = [
        {"name": name, "args": {"city": "Lisbon", "n": i}, "id": f"call_{ids.counter}_{i}"}
        for i, name in enumerate(names)
    ]
    return AIMessage(content="", tool_calls=calls, id=ids())


def results(ids: Ids, caller: AIMessage) -> list[ToolMessage]:
    return [
        ToolMessage(content=f"result of {call['name']}", tool_call_id=call["id"], name=call["name"], id=ids())
        for call in caller.tool_calls
    ]


def chat(count: int, ids: Ids | None = None) -> list[BaseMessage]:
    """System slot plus ``count`` alternating user/assistant text messages."""
    ids = ids or Ids()
    messages: list[BaseMessage] = [SystemMessage(content="You are a hotel assistant.")]
    for i in range(count):
        messages.append(human(ids, f"user message {i}") if i % 2 == 0 else ai(ids, f"assistant message {i}"))
    return messages


def transcript_of(model: RecordingModel) -> str:
    assert len(model.calls) == 1
    return "\n".join(str(m.content) for m in model.calls[0])


# --- configuration ---------------------------------------------------------------------------


def test_config_defaults() -> None:
    config = SummaryConfig()
    assert (config.min_messages, config.recent_messages) == (16, 8)


@pytest.mark.parametrize("min_messages, recent_messages", [(8, 1), (8, 6), (12, 6), (16, 8), (100, 98)])
def test_config_accepts_valid_values(min_messages: int, recent_messages: int) -> None:
    config = SummaryConfig(min_messages=min_messages, recent_messages=recent_messages)
    assert config.min_messages == min_messages


@pytest.mark.parametrize("min_messages", [7, 0, -1, 8.0, "16", True, None])
def test_config_rejects_bad_min_messages(min_messages: Any) -> None:
    with pytest.raises(ValueError, match="min_messages"):
        SummaryConfig(min_messages=min_messages, recent_messages=4)


@pytest.mark.parametrize("recent_messages", [0, -3, 7, 9, 4.0, "4", True, None])
def test_config_rejects_bad_recent_messages(recent_messages: Any) -> None:
    with pytest.raises(ValueError, match="recent_messages"):
        SummaryConfig(min_messages=8, recent_messages=recent_messages)


# --- threshold and basic compaction ----------------------------------------------------------


async def test_below_threshold_returns_none_without_calling_the_model() -> None:
    model = RecordingModel()
    config = SummaryConfig(min_messages=8, recent_messages=4)
    # chat(count) holds count + 1 messages: the system slot counts towards min_messages
    for count in (0, 1, 5, 6):
        assert await compact_history(chat(count), previous_summary=None, model=model, config=config) is None
    assert await compact_history([], previous_summary=None, model=model, config=config) is None
    assert model.calls == []


async def test_reaching_the_threshold_summarises_the_older_messages() -> None:
    model = RecordingModel()
    original = chat(7)
    config = SummaryConfig(min_messages=8, recent_messages=4)

    result = await compact_history(original, previous_summary=None, model=model, config=config)

    assert isinstance(result, CompactionResult)
    assert result.summary == "SUMMARY: user wants a hotel in Lisbon for 2 adults."
    assert result.messages[0] is original[0]
    assert result.messages[1:] == original[-4:]
    assert len(result.messages) == 1 + config.recent_messages
    assert result.summarized_through_id == original[-5].id
    assert result.response.usage_metadata["total_tokens"] == 150

    text = transcript_of(model)
    for message in original[1:-4]:
        assert message.content in text
    for message in original[-4:]:
        assert message.content not in text
    # the system prompt is rewritten every turn, so it is never summarised
    assert "You are a hotel assistant." not in text
    assert isinstance(model.calls[0][0], SystemMessage)


async def test_does_not_mutate_the_input_list() -> None:
    original = chat(20)
    snapshot = list(original)
    await compact_history(original, previous_summary=None, model=RecordingModel(), config=SummaryConfig())
    assert original == snapshot


async def test_summary_is_stripped_and_empty_reply_raises() -> None:
    model = RecordingModel(reply="  padded summary \n")
    result = await compact_history(chat(17), previous_summary=None, model=model, config=SummaryConfig())
    assert result is not None and result.summary == "padded summary"

    with pytest.raises(CompactionError):
        await compact_history(
            chat(17), previous_summary=None, model=RecordingModel(reply="  \n"), config=SummaryConfig()
        )


async def test_model_failure_propagates() -> None:
    with pytest.raises(RuntimeError, match="provider down"):
        await compact_history(
            chat(17), previous_summary="old", model=RecordingModel(error="provider down"), config=SummaryConfig()
        )


async def test_previous_summary_rolls_forward_into_the_request() -> None:
    model = RecordingModel()
    await compact_history(
        chat(17), previous_summary="Guest is Ana Silva, budget 180 EUR per night.", model=model, config=SummaryConfig()
    )
    assert "Guest is Ana Silva, budget 180 EUR per night." in transcript_of(model)


async def test_tool_calls_and_results_are_rendered_with_names_and_json_args() -> None:
    ids = Ids()
    caller = ai_calls(ids, "search_hotels", "get_weather")
    nameless = ToolMessage(content="sunny, 24C", tool_call_id=caller.tool_calls[1]["id"], id=ids())
    messages = [
        SystemMessage(content="prompt"),
        human(ids, "find hotels"),
        caller,
        results(ids, caller)[0],
        nameless,
        *chat(10, ids)[1:],
    ]
    model = RecordingModel()

    result = await compact_history(
        messages, previous_summary=None, model=model, config=SummaryConfig(min_messages=8, recent_messages=4)
    )

    assert result is not None
    text = transcript_of(model)
    assert "search_hotels" in text and json.dumps({"city": "Lisbon", "n": 0}, sort_keys=True) in text
    assert "result of search_hotels" in text
    # a result without a name borrows the name of the call it answers
    assert "get_weather" in text and "sunny, 24C" in text


async def test_force_compacts_below_threshold() -> None:
    model = RecordingModel()
    config = SummaryConfig(min_messages=16, recent_messages=4)
    original = chat(6)

    assert await compact_history(original, previous_summary=None, model=model, config=config) is None
    result = await compact_history(original, previous_summary=None, model=model, config=config, force=True)

    assert result is not None
    assert result.messages == [original[0], *original[-4:]]
    assert result.summarized_through_id == original[2].id


async def test_force_with_nothing_older_than_the_recent_window_returns_none() -> None:
    model = RecordingModel()
    config = SummaryConfig(min_messages=8, recent_messages=4)
    for count in (0, 3, 4):
        assert await compact_history(chat(count), previous_summary=None, model=model, config=config, force=True) is None
    assert model.calls == []


def test_summary_system_message_is_labelled() -> None:
    message = summary_system_message("Guest: Ana.", message_id="ExploreStep|x|1")
    assert isinstance(message, SystemMessage)
    assert message.id == "ExploreStep|x|1"
    assert "summary" in message.content.lower() and message.content.endswith("Guest: Ana.")


# --- the cut and tool-call boundaries --------------------------------------------------------


def test_cut_moves_earlier_to_keep_a_three_call_batch_together() -> None:
    ids = Ids()
    caller = ai_calls(ids, "a", "b", "c")
    messages = [
        SystemMessage(content="p"),
        human(ids, "go"),
        caller,
        *results(ids, caller),
        ai(ids, "done"),
        human(ids, "ok"),
        ai(ids, "bye"),
    ]
    # the plain cut (index 5) would land between the second and third result
    assert choose_cut(messages, 4) == 2
    assert orphan_tool_messages(messages[:1] + messages[2:]) == []


def test_cut_moves_later_when_moving_earlier_would_keep_everything() -> None:
    ids = Ids()
    caller = ai_calls(ids, "a", "b", "c")
    messages = [
        SystemMessage(content="p"),
        caller,
        *results(ids, caller),
        human(ids, "h"),
        ai(ids, "x"),
        human(ids, "h2"),
        ai(ids, "y"),
    ]
    assert choose_cut(messages, 6) == 5


def test_no_valid_cut_returns_one() -> None:
    ids = Ids()
    caller = ai_calls(ids, "a", "b", "c")
    assert choose_cut([SystemMessage(content="p"), caller, *results(ids, caller)], 2) == 1
    assert choose_cut(chat(3), 3) == 1
    assert choose_cut(chat(3), 5) == 1
    assert choose_cut([], 1) == 1


def test_cut_keeps_exactly_recent_messages_without_tool_boundaries() -> None:
    messages = chat(30)
    for recent in range(1, 29):
        assert choose_cut(messages, recent) == len(messages) - recent


def test_orphan_tool_messages() -> None:
    ids = Ids()
    caller = ai_calls(ids, "a", "b")
    done = results(ids, caller)
    assert orphan_tool_messages([SystemMessage(content="p"), caller, *done]) == []
    assert orphan_tool_messages([SystemMessage(content="p"), *done]) == done
    # a result that precedes its call is still an orphan
    assert orphan_tool_messages([done[0], caller, done[1]]) == [done[0]]


async def test_compaction_with_a_batch_straddling_the_boundary_leaves_no_orphans() -> None:
    ids = Ids()
    messages: list[BaseMessage] = chat(8, ids)
    caller = ai_calls(ids, "search", "price", "rooms")
    messages += [caller, *results(ids, caller), ai(ids, "here are the options")]
    model = RecordingModel()
    # 13 non-system messages; keeping the newest 4 would cut inside the 3 results
    result = await compact_history(
        messages, previous_summary=None, model=model, config=SummaryConfig(min_messages=10, recent_messages=4)
    )
    assert result is not None
    assert orphan_tool_messages(result.messages) == []
    assert result.messages[1] is caller
    assert result.summarized_through_id == messages[8].id


# --- property: any conversation, any config --------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[BaseMessage]:
    ids = Ids()
    messages: list[BaseMessage] = [SystemMessage(content="system prompt")]
    for kind in draw(st.lists(st.sampled_from(["human", "ai", "tools"]), max_size=40)):
        if kind == "human":
            messages.append(human(ids, f"h{ids.counter}"))
        elif kind == "ai":
            messages.append(ai(ids, f"a{ids.counter}"))
        else:
            caller = ai_calls(ids, *[f"tool{i}" for i in range(draw(st.integers(1, 4)))])
            messages += [caller, *results(ids, caller)]
    return messages


@st.composite
def configs(draw: st.DrawFn) -> SummaryConfig:
    min_messages = draw(st.integers(8, 20))
    return SummaryConfig(min_messages=min_messages, recent_messages=draw(st.integers(1, min_messages - 2)))


@settings(max_examples=300, deadline=None)
@given(messages=conversations(), config=configs(), force=st.booleans())
def test_property_compaction_never_orphans_tool_results(
    messages: list[BaseMessage], config: SummaryConfig, force: bool
) -> None:
    assert orphan_tool_messages(messages) == []
    model = RecordingModel()
    result = asyncio.run(compact_history(messages, previous_summary="prior", model=model, config=config, force=force))

    if result is None:
        assert model.calls == []
        under_threshold = not force and len(messages) < config.min_messages
        assert under_threshold or choose_cut(messages, config.recent_messages) == 1
        return

    kept = result.messages[1:]
    assert result.messages[0] is messages[0]
    assert 1 <= len(kept) < len(messages) - 1
    assert kept == messages[len(messages) - len(kept) :]
    assert orphan_tool_messages(result.messages) == []
    cut = len(messages) - len(kept)
    assert result.summarized_through_id == messages[cut - 1].id
    # nothing summarised away issued a call that is answered in the kept part, and vice versa
    summarised_calls = {c["id"] for m in messages[1:cut] if isinstance(m, AIMessage) for c in m.tool_calls}
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id in summarised_calls for m in kept)
    if not force:
        assert len(messages) >= config.min_messages
    target = len(messages) - config.recent_messages
    if not isinstance(messages[target], ToolMessage):
        assert len(kept) == config.recent_messages


@settings(max_examples=300, deadline=None)
@given(messages=conversations(), recent=st.integers(1, 30))
def test_property_choose_cut_is_in_range_and_respects_tool_batches(messages: list[BaseMessage], recent: int) -> None:
    cut = choose_cut(messages, recent)
    if cut == 1:
        return
    assert 2 <= cut < len(messages)
    assert orphan_tool_messages([messages[0], *messages[cut:]]) == []
