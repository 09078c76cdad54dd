"""The real ChatOpenAI, built by OpenAIProvider, against a local OpenAI-compatible server (no internet)."""

import email.utils
import time
from unittest.mock import patch

import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from picoflow.messages import usage_from_message
from picoflow.models.calls import model_call_for
from picoflow.models.openai import OpenAIProvider, retry_after_seconds
from picoflow.models.registry import ModelSelection, ProviderRegistry
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, usage_block

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

SELECTION = ModelSelection(provider="openai", name="gpt-4o", params={"temperature": 0.2})


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy configured in the environment would otherwise intercept the loopback calls.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def _tool_call_response() -> dict:
    return chat_completion(
        tool_calls=[{"id": "call_abc", "name": "get_weather", "args": {"city": "Oslo"}}],
        usage=usage_block(120, 30, cached_tokens=64, reasoning_tokens=12),
    )


def _text_response() -> dict:
    return chat_completion(
        content="It is sunny in Oslo.",
        usage=usage_block(160, 20, cached_tokens=128, reasoning_tokens=5),
    )


async def test_bound_tools_round_trip_through_a_real_chat_openai() -> None:
    with FakeOpenAIServer([_tool_call_response(), _text_response()]) as server:
        registry = ProviderRegistry([OpenAIProvider(api_key="test-key", base_url=server.url + "/v1")])
        model = registry.chat_model(SELECTION).bind_tools([WEATHER_TOOL])
        history = [SystemMessage(content="You report the weather."), HumanMessage(content="Weather in Oslo?")]

        call = await model.ainvoke(history)
        history += [call, ToolMessage(content='{"sky": "clear"}', tool_call_id="call_abc")]
        answer = await model.ainvoke(history)

    assert call.tool_calls == [{"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_abc", "type": "tool_call"}]
    assert answer.content == "It is sunny in Oslo."

    first, second = server.requests
    assert first["model"] == "gpt-4o"
    assert first["temperature"] == 0.2
    assert [tool["function"]["name"] for tool in first["tools"]] == ["get_weather"]
    assert first["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assert first["messages"] == [
        {"role": "system", "content": "You report the weather."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_abc"
    assert second["messages"][3]["tool_call_id"] == "call_abc"
    assert server.headers[0]["authorization"] == "Bearer test-key"

    usage = usage_from_message(call)
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (120, 30, 150)
    assert (usage.cached_input_tokens, usage.reasoning_tokens, usage.visible_output_tokens) == (64, 12, 18)
    final = usage_from_message(answer)
    assert (final.input_tokens, final.output_tokens, final.total_tokens) == (160, 20, 180)
    assert (final.cached_input_tokens, final.reasoning_tokens, final.visible_output_tokens) == (128, 5, 15)


def test_a_sync_call_works_and_takes_the_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer([_text_response()]) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "env-key")
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")

        answer = OpenAIProvider().chat_model(SELECTION).invoke("Weather in Oslo?")

    assert answer.content == "It is sunny in Oslo."
    assert server.requests[0]["messages"] == [{"role": "user", "content": "Weather in Oslo?"}]
    assert server.headers[0]["authorization"] == "Bearer env-key"


async def test_a_server_error_is_retried_by_the_client_then_fails() -> None:
    failure = (500, {"error": {"message": "upstream exploded", "type": "server_error"}}, {"retry-after-ms": "10"})
    with FakeOpenAIServer([failure, failure, failure, _text_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)

        with pytest.raises(openai.InternalServerError, match="upstream exploded"):
            await model.ainvoke("Weather in Oslo?")

    assert len(server.requests) == 1 + model.max_retries == 3


async def test_an_awaited_call_takes_langchains_asynchronous_path_on_the_callers_loop() -> None:
    from langchain_core.language_models import BaseChatModel

    with FakeOpenAIServer([_tool_call_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        with patch.object(BaseChatModel, "generate", side_effect=AssertionError("synchronous path taken")):
            answer = await model.bind_tools([WEATHER_TOOL]).ainvoke([HumanMessage(content="Weather in Oslo?")])

    assert answer.tool_calls[0]["args"] == {"city": "Oslo"}
    assert server.requests[0]["tools"][0]["function"]["name"] == "get_weather"
    assert model.root_async_client.max_retries == 2
    assert model.root_async_client.timeout == 60


def test_every_member_of_the_family_asks_streams_for_their_usage() -> None:
    # Streamed turns are counted like the others: each stream asks for usage (stream_options.include_usage).
    assert OpenAIProvider(api_key="k").chat_model(SELECTION).stream_usage is True
    assert OpenAIProvider(api_key="k", base_url="http://127.0.0.1:9/v1").chat_model(SELECTION).stream_usage is True
    azure = OpenAIProvider(
        api_key="k", base_url="https://example.openai.azure.com/", name="azure-openai", api_version="2024-10-21"
    )
    assert azure.chat_model(ModelSelection(provider="azure-openai", name="prod-gpt-4o")).stream_usage is True
    deepseek = OpenAIProvider(api_key="k", name="deepseek")
    assert deepseek.chat_model(ModelSelection(provider="deepseek", name="deepseek-chat")).stream_usage is True


async def test_a_retry_whose_wait_would_pass_the_calls_deadline_is_not_made() -> None:
    limited = (429, {"error": {"message": "Rate limit reached", "type": "requests"}}, {"Retry-After": "30"})
    with FakeOpenAIServer([limited, _text_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        started = time.monotonic()
        with model_call_for("chat", None, 5), pytest.raises(openai.RateLimitError):
            await model.ainvoke([HumanMessage(content="Weather in Oslo?")])
        assert time.monotonic() - started < 2

    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({"retry-after-ms": "1500"}, 1.5), ({"retry-after": "2"}, 2.0), ({"retry-after": "soon"}, None), ({}, None)],
)
def test_retry_after_is_read_in_milliseconds_seconds_or_as_a_date(headers: dict, expected: float | None) -> None:
    assert retry_after_seconds(headers) == expected
    stamp = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < retry_after_seconds({"retry-after": stamp}) <= 60
