"""The real ChatOpenAI, built by OpenAIProvider, against a local OpenAI-compatible server (no internet)."""

import asyncio
import threading
import time
from unittest.mock import patch

import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from picoflow.models.context import call_deadline
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ProviderRegistry
from picoflow.models.selection import ModelSelection
from picoflow.tokens import usage_from_message
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


async def test_a_server_error_fails_at_once_without_client_retries() -> None:
    failure = (500, {"error": {"message": "upstream exploded", "type": "server_error"}})
    with FakeOpenAIServer([failure, _text_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)

        with pytest.raises(Exception, match="upstream exploded"):
            await model.ainvoke("Weather in Oslo?")

    assert len(server.requests) == 1


async def test_an_awaited_call_runs_the_synchronous_client_on_a_worker_thread() -> None:
    """The synchronous client is the cheaper path per call; the loop stays free while it waits."""
    with FakeOpenAIServer([_text_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        threads: list[threading.Thread] = []
        generate = type(model)._generate

        def recording_generate(self, *args, **kwargs):  # noqa: ANN001, ANN202 - mirrors LangChain's signature
            threads.append(threading.current_thread())
            return generate(self, *args, **kwargs)

        loop_thread = threading.current_thread()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.ensure_future(ticker())
        with patch.object(type(model), "_generate", recording_generate):
            answer = await model.ainvoke([HumanMessage(content="Weather in Oslo?")])
        beat.cancel()

    assert answer.content == "It is sunny in Oslo."
    assert len(threads) == 1 and threads[0] is not loop_thread
    assert ticks > 1  # the loop kept running other tasks during the call


async def test_an_awaited_call_with_bound_tools_takes_langchains_synchronous_path() -> None:
    """The asynchronous call machinery is skipped, callbacks still see the call, and the loop stays free."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.language_models import BaseChatModel

    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.events: list[str] = []

        def on_chat_model_start(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - LangChain's signature
            self.events.append("start")

        def on_llm_end(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - LangChain's signature
            self.events.append("end")

    recorder = Recorder()
    with FakeOpenAIServer([_tool_call_response()]) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        generate = BaseChatModel.generate
        callers: list[threading.Thread] = []

        def recording_generate(self, *args, **kwargs):  # noqa: ANN001, ANN202 - mirrors LangChain's signature
            callers.append(threading.current_thread())
            return generate(self, *args, **kwargs)

        with (
            patch.object(BaseChatModel, "agenerate", side_effect=AssertionError("asynchronous path taken")),
            patch.object(BaseChatModel, "generate", recording_generate),
        ):
            answer = await model.bind_tools([WEATHER_TOOL]).ainvoke(
                [HumanMessage(content="Weather in Oslo?")], {"callbacks": [recorder]}
            )

    assert answer.tool_calls[0]["args"] == {"city": "Oslo"}
    assert server.requests[0]["tools"][0]["function"]["name"] == "get_weather"
    assert len(callers) == 1 and callers[0] is not threading.current_thread()
    assert recorder.events == ["start", "end"]


async def test_the_asynchronous_client_is_built_only_when_something_streams() -> None:
    """Awaited calls never need it; a stream builds it once, configured like the synchronous client."""
    server = FakeOpenAIServer([_text_response(), _text_response()])
    with server, patch.object(openai, "AsyncOpenAI", wraps=openai.AsyncOpenAI) as built:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        answer = await model.ainvoke([HumanMessage(content="Weather in Oslo?")])
        assert not built.called
        chunks = [chunk async for chunk in model.astream([HumanMessage(content="Weather in Oslo?")])]
        assert built.call_count == 1

    assert answer.content == "It is sunny in Oslo."
    assert "".join(chunk.content for chunk in chunks) == "It is sunny in Oslo."
    assert server.requests[1]["stream"] is True and "stream_options" not in server.requests[1]
    assert server.headers[1]["authorization"] == "Bearer test-key"
    assert model.root_async_client.max_retries == 0
    assert model.root_async_client.timeout == 60


def test_streams_from_openais_and_azures_own_endpoints_carry_usage() -> None:
    assert OpenAIProvider(api_key="k").chat_model(SELECTION).stream_usage is True
    assert not OpenAIProvider(api_key="k", base_url="http://127.0.0.1:9/v1").chat_model(SELECTION).stream_usage
    azure = OpenAIProvider(
        api_key="k", base_url="https://example.openai.azure.com/", name="azure-openai", api_version="2024-10-21"
    )
    assert azure.chat_model(ModelSelection(provider="azure-openai", name="prod-gpt-4o")).stream_usage is True
    deepseek = OpenAIProvider(api_key="k", name="deepseek")
    assert not deepseek.chat_model(ModelSelection(provider="deepseek", name="deepseek-chat")).stream_usage


async def test_a_call_on_a_worker_thread_stops_waiting_at_the_calls_deadline() -> None:
    """An abandoned call's thread must not wait on for the client's whole timeout (60 s by default)."""
    with FakeOpenAIServer([_text_response()], delay=5) as server:
        model = OpenAIProvider(api_key="test-key", base_url=server.url + "/v1").chat_model(SELECTION)
        token = call_deadline.set(time.monotonic() + 0.5)
        started = time.monotonic()
        try:
            with pytest.raises(openai.APITimeoutError):
                await model.ainvoke([HumanMessage(content="Weather in Oslo?")])
        finally:
            call_deadline.reset(token)
        assert time.monotonic() - started < 2.5
