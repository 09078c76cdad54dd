"""Prompt caching: the cache points Anthropic and Bedrock requests carry, the setting that removes them, the
turn notes kept after the cached prefix, and the fake servers' caching rules against hand-computed figures."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, Transition, stay, tool
from picoflow.errors import PicoFlowError
from picoflow.messages import TURN_NOTES_HEADING, TurnNotesMessage
from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.bedrock import BedrockProvider
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ProviderRegistry
from picoflow.stores import MemorySessionStore
from tests.support.fake_anthropic import FakeAnthropicServer, anthropic_message
from tests.support.fake_bedrock import FakeBedrock, converse_response
from tests.support.fake_openai import FakeOpenAIServer, chat_completion
from tests.support.prompt_cache import (
    BlockPrefixCache,
    OpenAIPrefixCache,
    anthropic_blocks,
    block,
    openai_prompt,
)

CLAUDE = "claude-sonnet-4-5"
BEDROCK_CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
EPHEMERAL = {"type": "ephemeral"}
CACHE_POINT = {"cachePoint": {"type": "default"}}
TOOL = {"type": "function", "function": {"name": "book", "description": "Book the room.",
                                         "parameters": {"type": "object", "properties": {"room": {"type": "string"}}}}}
REQUEST = [
    SystemMessage("You book rooms."),
    HumanMessage("A room, please."),
    AIMessage("", tool_calls=[{"name": "book", "args": {"room": "12"}, "id": "call_1"}]),
    ToolMessage("Booked.", tool_call_id="call_1"),
    TurnNotesMessage("Rooms left: 3"),
]
NOTES = f"{TURN_NOTES_HEADING}\nRooms left: 3"


def _anthropic_request(params: dict[str, Any] | None = None) -> dict[str, Any]:
    with FakeAnthropicServer([anthropic_message(content="Done.")]) as server:
        selection = ModelSelection(provider="anthropic", name=CLAUDE, params=params or {})
        model = AnthropicProvider(api_key="key", base_url=server.url).chat_model(selection)
        model.bind_tools([TOOL]).invoke(REQUEST)
    return server.requests[0]


def _bedrock_request(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    fake = FakeBedrock([converse_response(content="Done.")])
    selection = ModelSelection(provider="bedrock", name=name, params=params or {})
    fake.attach(BedrockProvider(region="us-east-1").chat_model(selection)).bind_tools([TOOL]).invoke(REQUEST)
    return fake.requests[0]


# -- request shapes ----------------------------------------------------------------------------------------


def test_anthropic_requests_mark_the_tools_the_system_prompt_and_the_last_stored_message() -> None:
    body = _anthropic_request()

    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    assert body["system"] == [{"type": "text", "text": "You book rooms.", "cache_control": EPHEMERAL}]
    # The tool result ends the stored history; the turn notes follow it in the same user turn, unmarked.
    result, notes = body["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["cache_control"] == EPHEMERAL
    assert notes == {"type": "text", "text": NOTES}
    assert sum(b.point for b in anthropic_blocks(body)) == 3


def test_prompt_cache_false_sends_anthropic_requests_without_cache_points() -> None:
    body = _anthropic_request({"prompt_cache": False})

    assert "cache_control" not in json.dumps(body)
    assert body["system"] == "You book rooms."


def test_bedrock_claude_requests_carry_cache_points_after_tools_system_and_history(aws_credentials: None) -> None:
    body = _bedrock_request(BEDROCK_CLAUDE)

    assert body["toolConfig"]["tools"][-1] == CACHE_POINT
    assert body["system"] == [{"text": "You book rooms."}, CACHE_POINT]
    assert [list(b) for b in body["messages"][-1]["content"]] == [["toolResult"], ["cachePoint"], ["text"]]
    assert body["messages"][-1]["content"][-1] == {"text": NOTES}


def test_bedrock_nova_takes_no_point_among_tools_or_beside_a_tool_result(aws_credentials: None) -> None:
    body = _bedrock_request("amazon.nova-lite-v1:0")

    assert CACHE_POINT not in body["toolConfig"]["tools"]
    assert body["system"][-1] == CACHE_POINT
    assert CACHE_POINT not in body["messages"][-1]["content"]


@pytest.mark.parametrize("name", [BEDROCK_CLAUDE, "amazon.nova-lite-v1:0", "meta.llama3-70b-instruct-v1:0"])
def test_prompt_cache_false_or_a_model_without_caching_sends_no_cache_point(name: str, aws_credentials: None) -> None:
    params = {} if name.startswith("meta.") else {"prompt_cache": False}
    assert "cachePoint" not in json.dumps(_bedrock_request(name, params))


@pytest.mark.parametrize("provider", [AnthropicProvider(api_key="k"), BedrockProvider(region="us-east-1")])
def test_prompt_cache_must_be_a_boolean(provider: Any) -> None:
    with pytest.raises(PicoFlowError, match="prompt_cache must be true or false"):
        provider.validate(ModelSelection(provider=provider.name, name=CLAUDE, params={"prompt_cache": "off"}))
    provider.validate(ModelSelection(provider=provider.name, name=CLAUDE, params={"prompt_cache": False}))


# -- turn notes and the caching rules on a two-call step ---------------------------------------------------

SYSTEM_PROMPT = "You book rooms at the Harbour Hotel. " * 120  # 4,440 bytes: 1,110 tokens
FEEDBACK = "Room 12 is booked. Tell the guest."


class RoomArgs(BaseModel):
    room: str


class BookStep(Step):
    def get_prompt(self) -> str:
        return SYSTEM_PROMPT

    def get_turn_notes(self) -> str:
        return f"Rooms left: {self.get_state('left') or 3}"

    @tool
    async def book(self, args: RoomArgs) -> Transition:
        """Book the room."""
        self.save_state({"left": 2})
        return stay(FEEDBACK)


class BookingFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="anthropic", name=CLAUDE)

    def define_steps(self) -> list[Step]:
        return [BookStep(self)]


async def _two_call_step(provider: Any) -> str:
    """One turn of ``BookStep`` on ``provider``: a call that books (its tool answers ``FEEDBACK``), then a call
    that answers; the stored session's JSON."""
    store = MemorySessionStore()
    engine = FlowEngine(flows=[BookingFlow], session_store=store, providers=ProviderRegistry(override=provider))
    response = await engine.run(flow_name="BookingFlow", user_message="Room 12, please.")
    assert response.success, response.message
    doc = await store.load(str(response.session))
    assert doc is not None
    return doc.model_dump_json(by_alias=True)


def _tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


def _notes(left: int) -> str:
    return f"{TURN_NOTES_HEADING}\nRooms left: {left}"


BOOK = {"id": "call_1", "name": "book", "args": {"room": "12"}}


async def test_turn_notes_follow_the_stored_history_and_are_never_stored() -> None:
    with FakeAnthropicServer([anthropic_message(tool_calls=[BOOK]), anthropic_message(content="Done.")]) as server:
        stored = await _two_call_step(AnthropicProvider(api_key="k", base_url=server.url))

    # A new session opens with the framework's "Start" message, then the user's words.
    assert server.requests[0]["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Start"},
        {"type": "text", "text": "Room 12, please.", "cache_control": EPHEMERAL},
        {"type": "text", "text": _notes(3)},
    ]}]
    # The second call reads the state the tool saved, after the tool result.
    assert server.requests[1]["messages"][-1]["content"][-1] == {"type": "text", "text": _notes(2)}
    assert "Room 12, please." in stored and "Rooms left" not in stored


async def test_anthropic_rule_on_a_two_call_step_matches_hand_computed_figures() -> None:
    cache = BlockPrefixCache(lambda: 0.0)
    with FakeAnthropicServer([anthropic_message(tool_calls=[BOOK]), anthropic_message(content="Done.")],
                             cache=cache) as server:
        await _two_call_step(AnthropicProvider(api_key="k", base_url=server.url))

    # The blocks by hand. First call: the tool (point), the system prompt (point), the session's opening
    # "Start" (2 tokens), the user's words (point), the notes. Second call: the same four, the tool call, the
    # tool result (point), the new notes.
    tool_ = _tokens(json.dumps({"name": "book", "description": "Book the room.", "input_schema": {
        "properties": {"room": {"type": "string"}}, "required": ["room"], "type": "object"}}, sort_keys=True))
    system, user = 1110, _tokens("Start") + _tokens("Room 12, please.")
    call = _tokens(json.dumps({"type": "tool_use", "id": "call_1", "name": "book", "input": {"room": "12"}},
                              sort_keys=True))
    result = _tokens(json.dumps({"type": "tool_result", "tool_use_id": "call_1", "is_error": False,
                                 "content": [{"type": "text", "text": FEEDBACK}]}, sort_keys=True))
    # The tool alone is under Claude's 1,024-token minimum, so its point writes nothing; the others write.
    assert tool_ < 1024 <= tool_ + system
    assert server.usages[0] == {"input_tokens": _tokens(_notes(3)), "cache_read_input_tokens": 0,
                                "cache_creation_input_tokens": tool_ + system + user, "output_tokens": 5}
    # The second call reads the first call's prefix (found 2 blocks before its last point) and writes the rest.
    assert server.usages[1] == {"input_tokens": _tokens(_notes(2)), "cache_read_input_tokens": tool_ + system + user,
                                "cache_creation_input_tokens": call + result, "output_tokens": 2}


async def test_openai_rule_on_a_two_call_step_matches_hand_computed_figures() -> None:
    cache = OpenAIPrefixCache(lambda: 0.0)
    with FakeOpenAIServer([chat_completion(tool_calls=[BOOK]), chat_completion(content="Done.")],
                          cache=cache) as server:
        await _two_call_step(OpenAIProvider(api_key="k", base_url=f"{server.url}/v1"))

    first, second = (openai_prompt(body) for body in server.requests)
    # By hand: the prompts agree up to the content of the message after the user's words (the notes, then the
    # assistant's tool call); the cache holds 1,024 tokens and whole 128-token steps of that prefix.
    shared = first.index(b'{"content": "[Notes') + len('{"content": ')
    assert first[:shared] == second[:shared] and first[shared] != second[shared]
    assert shared // 4 == 1196  # 1,024 + 172: one whole step of 128
    assert [u["prompt_tokens"] for u in server.usages] == [_tokens(first.decode()), _tokens(second.decode())]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in server.usages] == [0, 1024 + 128]


def test_cache_entries_expire_five_minutes_after_their_last_use() -> None:
    now = [0.0]
    cache = BlockPrefixCache(lambda: now[0])
    blocks = [block(SYSTEM_PROMPT, point=True)]
    assert cache.request(blocks).cache_write == 1110
    now[0] = 299.0
    assert cache.request(blocks).cache_read == 1110  # a hit renews the entry's five minutes
    now[0] = 598.0
    assert cache.request(blocks).cache_read == 1110
    now[0] = 898.5
    assert (cache.request(blocks).cache_read, cache.request(blocks).cache_read) == (0, 1110)
    # Below the minimum nothing is written; OpenAI caches nothing under 1,024 tokens either.
    assert cache.request([block("short", point=True)]).cache_write == 0
    openai = OpenAIPrefixCache(lambda: now[0])
    assert [openai.request(b"x" * 4000).cache_read for _ in range(2)] == [0, 0]
    assert [openai.request(b"y" * 4200).cache_read for _ in range(2)] == [0, 1024]
