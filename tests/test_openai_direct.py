"""Chat Completions requests sent without the SDK's parameter transform are the SDK's requests, byte for byte."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from openai._utils import maybe_transform
from openai.types.chat import completion_create_params

from picoflow.models._openai_direct import DirectCompletions
from picoflow.models.openai import OpenAIProvider
from picoflow.models.selection import ModelSelection
from tests.support.fake_openai import chat_completion, completion_chunks, usage_block

WEATHER = convert_to_openai_tool(
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    }
)

CONVERSATION = [
    SystemMessage(content="You plan trips. Answer in one line."),
    HumanMessage(content="Weather in Oslo for two days? Ünïcode ✓"),
    AIMessage(content="", tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Oslo", "days": 2}}]),
    ToolMessage(content='{"sky": "clear"}', tool_call_id="call_1", name="get_weather"),
    AIMessage(content="Clear skies in Oslo."),
    HumanMessage(
        content=[
            {"type": "text", "text": "And this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
        ]
    ),
]


def _payloads() -> list[dict[str, Any]]:
    """Request payloads as langchain-openai builds them: plain text, tools and tool results, parameters, a stream."""
    plain = ChatOpenAI(model="gpt-4o", api_key="k")
    tuned = ChatOpenAI(model="gpt-4o", api_key="k", temperature=0.2, max_tokens=300, seed=7, top_p=0.9)
    return [
        plain._get_request_payload([HumanMessage(content="Hi")]),
        plain._get_request_payload(CONVERSATION, tools=[WEATHER], tool_choice="auto", parallel_tool_calls=False),
        tuned._get_request_payload(CONVERSATION, stop=["\n\n"], tools=[WEATHER]),
        ChatOpenAI(model="o4-mini", api_key="k", reasoning_effort="low")._get_request_payload(CONVERSATION),
        {**plain._get_request_payload(CONVERSATION), "stream": True, "stream_options": {"include_usage": True}},
    ]


class Capture:
    """An HTTP transport that records each request and answers like the Chat Completions endpoint."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        completion = chat_completion(content="Clear skies.", usage=usage_block(40, 5))
        if json.loads(request.content).get("stream"):
            events = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in completion_chunks(completion, usage=True))
            return httpx2.Response(200, text=events + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})
        return httpx2.Response(200, json=completion, headers={"x-request-id": "req_1"})


def _client(kind: str, capture: Capture) -> Any:
    http = httpx2.Client(transport=httpx2.MockTransport(capture))
    if kind == "azure":
        return openai.AzureOpenAI(
            api_key="azure-key", azure_endpoint="https://example.openai.azure.com", api_version="2024-10-21",
            http_client=http, max_retries=0,
        )
    return openai.OpenAI(api_key="sk-test", base_url="https://api.example.com/v1", http_client=http, max_retries=0)


def _sent(request: httpx2.Request) -> tuple[str, str, dict[str, str], Any]:
    # Every header must match, the retry count and the timeout the option sets included; the body as JSON, since
    # the SDK writes its top-level fields in an order of its own.
    return request.method, str(request.url), dict(request.headers), json.loads(request.content)


@pytest.mark.parametrize("kind", ["openai", "azure"])
@pytest.mark.parametrize("index", range(5))
def test_a_request_sent_directly_is_the_sdks_request(kind: str, index: int) -> None:
    payload = _payloads()[index]
    sdk, direct = Capture(), Capture()
    through_sdk = _client(kind, sdk).chat.completions.create(**payload, timeout=12.5)
    through_direct = DirectCompletions(_client(kind, direct).chat.completions).create(**payload, timeout=12.5)

    assert _sent(direct.requests[0]) == _sent(sdk.requests[0])
    if payload.get("stream"):
        assert [c.model_dump() for c in through_direct] == [c.model_dump() for c in through_sdk]
    else:
        assert through_direct.model_dump() == through_sdk.model_dump()


def test_the_raw_response_form_is_the_sdks() -> None:
    payload = _payloads()[1]
    sdk, direct = Capture(), Capture()
    raw_sdk = _client("openai", sdk).chat.completions.with_raw_response.create(**payload, extra_headers={"x-a": "1"})
    raw_direct = DirectCompletions(_client("openai", direct).chat.completions).with_raw_response.create(
        **payload, extra_headers={"x-a": "1"}
    )

    assert _sent(direct.requests[0]) == _sent(sdk.requests[0])
    assert raw_direct.headers["x-request-id"] == "req_1"
    assert raw_direct.parse().model_dump() == raw_sdk.parse().model_dump()


def test_the_sdk_transform_leaves_langchains_payloads_unchanged() -> None:
    """The premise: for what langchain-openai sends, skipping the transform changes nothing."""
    for payload in _payloads():
        schema = (
            completion_create_params.CompletionCreateParamsStreaming
            if payload.get("stream")
            else completion_create_params.CompletionCreateParamsNonStreaming
        )
        assert maybe_transform(payload, schema) == payload


def test_an_sdk_whose_create_cannot_be_recorded_is_used_as_it_is() -> None:
    class OldCompletions:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def create(self, *, model: str, messages: list[Any], **kwargs: Any) -> str:
            self.calls.append({"model": model, "messages": messages, **kwargs})
            return "sent by the SDK"

    old = OldCompletions()
    answer = DirectCompletions(old).create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], timeout=3)

    assert answer == "sent by the SDK"
    assert old.calls == [{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "timeout": 3}]


def test_the_providers_models_send_directly_and_copy() -> None:
    model = OpenAIProvider(api_key="k", base_url="http://127.0.0.1:9/v1").chat_model(
        ModelSelection(provider="openai", name="gpt-4o")
    )
    assert isinstance(model.client, DirectCompletions)
    assert isinstance(copy.copy(model.client), DirectCompletions)
    assert model.client.with_streaming_response is not None  # the resource's own attributes show through
    # Structured output and the asynchronous client keep the SDK's own resources.
    assert not isinstance(model.root_client.chat.completions, DirectCompletions)
