"""Streamed turns on the real provider clients: LangChain's astream against the fake OpenAI-compatible and Anthropic
servers (server-sent chunks), against Bedrock's ConverseStream (answered inside botocore) and against Gemini's
streamGenerateContent. Text arrives in
pieces, tool calls are taken back, usage is still counted, a stalled stream is cut by the call's timeout, and a
stream that ends without the provider's finish reason (a cut connection) is a failed call on every provider."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, tool
from picoflow.events import TurnEvent
from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.bedrock import BedrockProvider
from picoflow.models.google import GoogleProvider
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ModelProvider, ProviderRegistry
from picoflow.models.registry import ModelSelection as Selection
from picoflow.stores import MemorySessionStore
from tests.support.fake_anthropic import FakeAnthropicServer, anthropic_message
from tests.support.fake_bedrock import FakeBedrock, converse_response
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, text_pieces, usage_block

REPLY = "Room twelve is free on Friday, for ninety euros."
LOOKUP = {"id": "call_1", "name": "find_room", "args": {"day": "Friday"}}


class Day(BaseModel):
    day: str


class RoomStep(Step):
    def get_prompt(self) -> str:
        return "Find rooms."

    def use_tools(self) -> list[str]:
        return ["find_room"]

    @tool
    async def find_room(self, args: dict[str, Any]) -> Any:
        return None


class RoomFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="fixed", name="any", retry_attempts=1)

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="find_room", description="Find a free room.", schema=Day)]

    def define_steps(self) -> list[Step]:
        return [RoomStep(self)]


class SlowRoomFlow(RoomFlow):
    id = "SlowRoomFlow"

    def config_llm_call_policy(self) -> dict[str, Any]:
        return {"timeout_ms": 1_000}


class Fixed(ModelProvider):
    """Serves every selection with one prepared chat model (a real provider's, pointed at a fake)."""

    name = "fixed"

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model

    def chat_model(self, selection: Selection) -> BaseChatModel:
        return self.model


async def stream_turn(model: BaseChatModel, flow: type[Flow] = RoomFlow) -> list[TurnEvent]:
    engine = FlowEngine([flow], MemorySessionStore(), ProviderRegistry(override=Fixed(model)), retry_delay=0)
    return [event async for event in engine.stream(flow.id, "A room for Friday?")]


def check(events: list[TurnEvent], input_tokens: int, output_tokens: int) -> None:
    names = [event.event for event in events]
    assert names[-1] == "committed", events[-1].data
    # The tool call's turn showed nothing; the reply came word by word.
    assert names.count("delta") == len(REPLY.split())
    assert {"name": "find_room"} in [event.data for event in events if event.event == "tool"]
    assert "".join(event.data["text"] for event in events if event.event == "delta") == REPLY
    tokens = events[-1].response.tokens
    assert (tokens.input_tokens, tokens.output_tokens) == (input_tokens, output_tokens)


def test_openai_streams_with_usage_requested_and_counted() -> None:
    replies = [chat_completion(tool_calls=[LOOKUP], usage=usage_block(40, 6)),
               chat_completion(content=REPLY, usage=usage_block(55, 12))]
    with FakeOpenAIServer(replies) as server:
        model = OpenAIProvider(api_key="k", base_url=f"{server.url}/v1").chat_model(
            ModelSelection(provider="openai", name="gpt-4o"))
        events = asyncio.run(stream_turn(model))
    check(events, 95, 18)
    assert all(request["stream"] is True for request in server.requests)
    assert all(request["stream_options"] == {"include_usage": True} for request in server.requests)


def test_anthropic_streams_with_usage_counted() -> None:
    replies = [anthropic_message(tool_calls=[LOOKUP], usage={"input_tokens": 40, "output_tokens": 6}),
               anthropic_message(content=REPLY, usage={"input_tokens": 55, "output_tokens": 12})]
    with FakeAnthropicServer(replies) as server:
        model = AnthropicProvider(api_key="k", base_url=server.url).chat_model(
            ModelSelection(provider="anthropic", name="claude-sonnet-4-5"))
        events = asyncio.run(stream_turn(model))
    check(events, 95, 18)
    assert all(request["stream"] is True for request in server.requests)


def test_bedrock_converse_streams_with_usage_counted(aws_credentials: None) -> None:
    fake = FakeBedrock([converse_response(tool_calls=[LOOKUP]), converse_response(content=REPLY)])
    model = fake.attach(BedrockProvider(region="us-east-1").chat_model(
        ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0")))
    events = asyncio.run(stream_turn(model))
    outputs = sum(usage["outputTokens"] for usage in fake.usages)
    check(events, 0, outputs)
    assert len(fake.requests) == 2


def test_a_stream_stalling_between_chunks_is_cut_by_the_call_timeout() -> None:
    replies = [chat_completion(content=REPLY, usage=usage_block(10, 5))]
    with FakeOpenAIServer(replies, chunk_delay=0.4) as server:
        model = OpenAIProvider(api_key="k", base_url=f"{server.url}/v1").chat_model(
            ModelSelection(provider="openai", name="gpt-4o"))
        events = asyncio.run(stream_turn(model, SlowRoomFlow))
    names = [event.event for event in events]
    assert names[-1] == "aborted" and events[-1].data["code"] == "MODEL_TIMEOUT"
    assert names[0] == "delta" and "reset" in names  # it had started, and its words were taken back
    assert server.url not in str([event.data for event in events])


class GeminiStreamServer:
    """A loopback Gemini API answering ``streamGenerateContent?alt=sse`` with ``replies`` in order, each as
    server-sent ``GenerateContentResponse`` chunks: its text word by word, its usage with the last one."""

    def __init__(self, replies: list[tuple[str, dict[str, int]]], cut: int = 0) -> None:
        self.replies = list(replies)
        self.cut = cut
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.paths.append(self.path)
                text, usage = outer.replies.pop(0)
                chunks = [{"candidates": [{"content": {"role": "model", "parts": [{"text": piece}]}, "index": 0}]}
                          for piece in text_pieces(text)]
                if outer.cut > 0:
                    outer.cut -= 1
                else:
                    chunks[-1]["candidates"][0]["finishReason"] = "STOP"
                    chunks[-1]["usageMetadata"] = usage
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
                """Silent."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ChatStep(Step):
    def get_prompt(self) -> str:
        return "Answer."


class ChatFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="fixed", name="any", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [ChatStep(self)]


def test_google_streams_with_usage_counted() -> None:
    server = GeminiStreamServer([(REPLY, {"promptTokenCount": 30, "candidatesTokenCount": 11,
                                          "totalTokenCount": 41})])
    try:
        model = GoogleProvider(api_key="k", base_url=server.url).chat_model(
            ModelSelection(provider="google", name="gemini-2.5-flash"))
        events = asyncio.run(stream_turn(model, ChatFlow))
    finally:
        server.close()
    names = [event.event for event in events]
    assert names[-1] == "committed", events[-1].data
    assert names.count("delta") == len(REPLY.split())
    assert "".join(event.data["text"] for event in events if event.event == "delta") == REPLY
    assert ":streamGenerateContent" in server.paths[0]
    tokens = events[-1].response.tokens
    assert (tokens.input_tokens, tokens.output_tokens) == (30, 11)


# -- streams cut before their end ----------------------------------------------------------------------

CUT = "Abraham Lincoln was the"
WHOLE = "Abraham Lincoln was the sixteenth president."


class RetryingChatFlow(ChatFlow):
    id = "RetryingChatFlow"

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="fixed", name="any", retry_attempts=2)


class CuttingOpenAIServer(FakeOpenAIServer):
    """Its first streamed answer stops before the chunk with the finish reason, as a closed connection would."""

    cut = 1

    def stream_events(self, body: dict[str, Any], payload: dict[str, Any]) -> list[str]:
        events = super().stream_events(body, payload)
        if self.cut <= 0:
            return events
        self.cut -= 1
        return [e for e in events if e.startswith("data: {") and json.loads(e[6:])["choices"]
                and json.loads(e[6:])["choices"][0]["finish_reason"] is None]


class CuttingAnthropicServer(FakeAnthropicServer):
    cut = 1

    def stream_events(self, body: dict[str, Any], payload: dict[str, Any]) -> list[str]:
        events = super().stream_events(body, payload)
        if self.cut <= 0:
            return events
        self.cut -= 1
        return [e for e in events if "message_delta" not in e and "message_stop" not in e]


def cut_then_whole(model: BaseChatModel) -> list[TurnEvent]:
    events = asyncio.run(stream_turn(model, RetryingChatFlow))
    names = [event.event for event in events]
    # The cut reply was shown, taken back, and the second attempt's reply committed.
    assert names[-1] == "committed", events[-1].data
    assert "reset" in names
    shown = "".join(e.data["text"] for e in events[: names.index("reset")] if e.event == "delta")
    assert shown == CUT
    assert events[-1].data["message"] == WHOLE
    return events


def test_a_cut_openai_stream_is_a_failed_call_and_retried() -> None:
    replies = [chat_completion(content=CUT, usage=usage_block(10, 5)),
               chat_completion(content=WHOLE, usage=usage_block(10, 7))]
    with CuttingOpenAIServer(replies) as server:
        model = OpenAIProvider(api_key="k", base_url=f"{server.url}/v1").chat_model(
            ModelSelection(provider="openai", name="gpt-4o"))
        cut_then_whole(model)
    assert len(server.requests) == 2


def test_a_cut_anthropic_stream_is_a_failed_call_and_retried() -> None:
    replies = [anthropic_message(content=CUT, usage={"input_tokens": 10, "output_tokens": 5}),
               anthropic_message(content=WHOLE, usage={"input_tokens": 10, "output_tokens": 7})]
    with CuttingAnthropicServer(replies) as server:
        model = AnthropicProvider(api_key="k", base_url=server.url).chat_model(
            ModelSelection(provider="anthropic", name="claude-sonnet-4-5"))
        cut_then_whole(model)
    assert len(server.requests) == 2


def test_a_cut_bedrock_stream_is_a_failed_call_and_retried(aws_credentials: None) -> None:
    fake = FakeBedrock([converse_response(content=CUT), converse_response(content=WHOLE)], cut=1)
    model = fake.attach(BedrockProvider(region="us-east-1").chat_model(
        ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0")))
    cut_then_whole(model)
    assert len(fake.requests) == 2


def test_a_cut_google_stream_is_a_failed_call_and_retried() -> None:
    usage = {"promptTokenCount": 30, "candidatesTokenCount": 11, "totalTokenCount": 41}
    server = GeminiStreamServer([(CUT, usage), (WHOLE, usage)], cut=1)
    try:
        model = GoogleProvider(api_key="k", base_url=server.url).chat_model(
            ModelSelection(provider="google", name="gemini-2.5-flash"))
        cut_then_whole(model)
    finally:
        server.close()
    assert len(server.paths) == 2


def test_a_stream_cut_on_every_attempt_aborts_the_turn_without_changing_the_session() -> None:
    replies = [chat_completion(content=CUT, usage=usage_block(10, 5))]
    with CuttingOpenAIServer(replies) as server:
        model = OpenAIProvider(api_key="k", base_url=f"{server.url}/v1").chat_model(
            ModelSelection(provider="openai", name="gpt-4o"))
        events = asyncio.run(stream_turn(model, ChatFlow))
    names = [event.event for event in events]
    assert names[-1] == "aborted" and events[-1].data["code"] == "MODEL_UNAVAILABLE"
    assert "reset" in names and CUT not in json.dumps(events[-1].data)
