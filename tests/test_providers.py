"""The built-in providers, offline: the OpenAI-compatible family and Anthropic and Google over HTTP against a
local server, Bedrock through a botocore Stubber; each one's token usage mapped into the 7-field record."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import BaseModel

from picoflow.errors import PicoFlowError
from picoflow.messages import usage_from_message
from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.bedrock import BedrockProvider
from picoflow.models.common import CLIENT_RETRIES, DEFAULT_TIMEOUT_SECONDS, usage_normalising
from picoflow.models.factory import default_registry
from picoflow.models.google import GoogleProvider
from picoflow.models.openai import OPENAI_COMPATIBLE, OpenAIProvider
from picoflow.models.registry import ModelSelection, ProviderRegistry
from picoflow.session.document import TokenUsage
from tests.support.fake_openai import FakeOpenAIServer, chat_completion

BUILT_IN = [
    "openai", "azure-openai", "deepseek", "moonshot", "zai", "openrouter", "ollama", "anthropic", "google", "bedrock"
]

# Every variable a provider reads: each test states the environment it means.
PROVIDER_VARIABLES = (
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT",
    "OPENAI_API_VERSION", "DEEPSEEK_API_KEY", "DEEPSEEK_BASE_URL", "MOONSHOT_API_KEY", "MOONSHOT_BASE_URL",
    "ZAI_API_KEY", "ZAI_BASE_URL", "OPENROUTER_API_KEY", "OPENROUTER_BASE_URL", "OLLAMA_API_KEY",
    "OLLAMA_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "GOOGLE_API_KEY", "GEMINI_API_KEY",
    "GOOGLE_BASE_URL", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_GENAI_USE_VERTEXAI", "PICOFLOW_SCRIPT",
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy configured in the environment would otherwise intercept the loopback calls.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class RoutingServer(FakeOpenAIServer):
    """The fake server answering a POST on any path, with each request's path (and query) recorded."""

    def __init__(self, responses: list[Any]) -> None:
        self.paths: list[str] = []
        super().__init__(responses)

    def _handler_class(self) -> type:
        server = self

        class Handler(super()._handler_class()):
            def do_POST(self) -> None:
                server.paths.append(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._reply(*server._next(body, {k.lower(): v for k, v in self.headers.items()}))

        return Handler


class RecordingServer:
    """A loopback JSON server for the non-OpenAI APIs: answers POSTs on any path with ``responses`` in order,
    recording each request's path, headers and body."""

    def __init__(self, responses: list[dict[str, Any]]) -> None:
        self._responses = list(responses)
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                server.paths.append(self.path)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                server.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                status, payload = (200, server._responses.pop(0)) if server._responses else (500, {"error": "none"})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Silent."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _tokens(usage: TokenUsage) -> dict[str, int]:
    return usage.model_dump(by_alias=True)


def _record(
    inputs: int, outputs: int, total: int, *, reasoning: int = 0, cached: int = 0, created: int = 0
) -> dict[str, int]:
    return {
        "inputTokens": inputs,
        "outputTokens": outputs,
        "totalTokens": total,
        "reasoningTokens": reasoning,
        "visibleOutputTokens": outputs - reasoning,
        "cachedInputTokens": cached,
        "cacheCreationInputTokens": created,
    }


# -- the OpenAI-compatible family over HTTP ----------------------------------------------------------------

# provider -> (model, the usage block its server reports, the record it maps to)
COMPATIBLE_CALLS: dict[str, tuple[str, dict[str, Any], dict[str, int]]] = {
    "openai": (
        "gpt-5-mini",
        {
            "prompt_tokens": 1500, "completion_tokens": 420, "total_tokens": 1920,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 384, "audio_tokens": 0},
        },
        _record(1500, 420, 1920, reasoning=384, cached=1024),
    ),
    # DeepSeek reports cache hits as prompt_cache_hit_tokens / prompt_cache_miss_tokens.
    "deepseek": (
        "deepseek-reasoner",
        {
            "prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500,
            "prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176,
            "completion_tokens_details": {"reasoning_tokens": 250},
        },
        _record(1200, 300, 1500, reasoning=250, cached=1024),
    ),
    # Moonshot reports cache hits as a top-level cached_tokens.
    "moonshot": (
        "kimi-k2-0905-preview",
        {"prompt_tokens": 900, "completion_tokens": 120, "total_tokens": 1020, "cached_tokens": 512},
        _record(900, 120, 1020, cached=512),
    ),
    "zai": (
        "glm-4.6",
        {
            "prompt_tokens": 700, "completion_tokens": 90, "total_tokens": 790,
            "prompt_tokens_details": {"cached_tokens": 256},
        },
        _record(700, 90, 790, cached=256),
    ),
    # OpenRouter adds cache writes (Anthropic models behind it) and the cost.
    "openrouter": (
        "anthropic/claude-sonnet-4.5",
        {
            "prompt_tokens": 2000, "completion_tokens": 400, "total_tokens": 2400, "cost": 0.0123,
            "prompt_tokens_details": {"cached_tokens": 1500, "cache_write_tokens": 300, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 150},
        },
        _record(2000, 400, 2400, reasoning=150, cached=1500, created=300),
    ),
    "ollama": (
        "llama3.2",
        {"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59},
        _record(42, 17, 59),
    ),
}


def _default_path(provider: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(OPENAI_COMPATIBLE[provider].default_base_url or "").path


@pytest.mark.parametrize("provider", sorted(COMPATIBLE_CALLS))
async def test_each_compatible_provider_calls_its_endpoint_with_its_key_and_maps_its_usage(provider: str) -> None:
    model_name, usage, expected = COMPATIBLE_CALLS[provider]
    spec = OPENAI_COMPATIBLE[provider]
    with RoutingServer([chat_completion(content="Hello there.", usage=usage, model=model_name)]) as server:
        # The endpoint variable keeps the default URL's path, so the request path is the real one.
        env = {spec.base_url_env: server.url + _default_path(provider), spec.key_env: f"{provider}-key"}
        registry = default_registry(env)
        reply = await registry.chat_model(ModelSelection(provider=provider, name=model_name)).ainvoke("Hi")

    assert reply.content == "Hello there."
    assert server.paths == [_default_path(provider) + "/chat/completions"]
    assert server.headers[0]["authorization"] == f"Bearer {provider}-key"
    assert server.requests[0]["model"] == model_name
    assert server.requests[0]["messages"] == [{"role": "user", "content": "Hi"}]
    assert _tokens(usage_from_message(reply)) == expected


def test_deepseek_cache_hits_in_prompt_tokens_details_count_once() -> None:
    usage = {
        "prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500,
        "prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    with RoutingServer([chat_completion(content="ok", usage=usage)]) as server:
        env = {"DEEPSEEK_API_KEY": "k", "DEEPSEEK_BASE_URL": server.url}
        reply = default_registry(env).chat_model(ModelSelection(provider="deepseek", name="deepseek-chat")).invoke("Hi")

    assert reply.usage_metadata["input_token_details"]["cache_read"] == 1024
    assert _tokens(usage_from_message(reply)) == _record(1200, 300, 1500, cached=1024)


def test_ollama_needs_no_key_and_takes_its_endpoint_as_a_bare_host() -> None:
    with RoutingServer([chat_completion(content="ok", usage=COMPATIBLE_CALLS["ollama"][1])]) as server:
        # Ollama's own clients take http://host:11434; its OpenAI API lives under /v1.
        registry = default_registry({"OLLAMA_BASE_URL": server.url})
        reply = registry.chat_model(ModelSelection(provider="ollama", name="llama3.2")).invoke("Hi")

    assert reply.content == "ok"
    assert server.paths == ["/v1/chat/completions"]


def test_azure_openai_calls_the_deployment_with_its_api_key_and_version() -> None:
    usage = {
        "prompt_tokens": 800, "completion_tokens": 60, "total_tokens": 860,
        "prompt_tokens_details": {"cached_tokens": 640, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    with RoutingServer([chat_completion(content="From Azure.", usage=usage)]) as server:
        env = {
            "AZURE_OPENAI_API_KEY": "azure-key",
            "AZURE_OPENAI_ENDPOINT": server.url,
            "OPENAI_API_VERSION": "2024-10-21",
        }
        selection = ModelSelection(provider="azure-openai", name="prod-gpt-4o", params={"temperature": 0.1})
        reply = default_registry(env).chat_model(selection).invoke("Hi")

    assert reply.content == "From Azure."
    assert server.paths == ["/openai/deployments/prod-gpt-4o/chat/completions?api-version=2024-10-21"]
    assert server.headers[0]["api-key"] == "azure-key"
    assert "authorization" not in server.headers[0]
    assert server.requests[0]["temperature"] == 0.1
    assert _tokens(usage_from_message(reply)) == _record(800, 60, 860, cached=640)


@pytest.mark.parametrize("provider", sorted(set(OPENAI_COMPATIBLE) - {"azure-openai"}))
def test_each_compatible_provider_defaults_to_its_documented_endpoint(provider: str) -> None:
    spec = OPENAI_COMPATIBLE[provider]
    name = "gpt-4o" if provider == "openai" else "some-model"
    model = default_registry({spec.key_env: "k"}).chat_model(ModelSelection(provider=provider, name=name))

    assert str(model.root_client.base_url).rstrip("/") == spec.default_base_url
    assert model.max_retries == CLIENT_RETRIES
    assert model.request_timeout == DEFAULT_TIMEOUT_SECONDS


def test_a_selection_timeout_replaces_the_default() -> None:
    selection = ModelSelection(provider="deepseek", name="deepseek-chat", params={"timeout": 12})
    model = default_registry({"DEEPSEEK_API_KEY": "k"}).chat_model(selection)

    assert model.request_timeout == 12


class Booking(BaseModel):
    city: str
    nights: int


async def test_compatible_servers_get_structured_output_through_a_tool_call() -> None:
    reply = chat_completion(
        tool_calls=[{"id": "call_1", "name": "Booking", "args": {"city": "Oslo", "nights": 2}}],
        usage={"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102},
    )
    with RoutingServer([reply]) as server:
        env = {"DEEPSEEK_API_KEY": "k", "DEEPSEEK_BASE_URL": server.url}
        model = default_registry(env).chat_model(ModelSelection(provider="deepseek", name="deepseek-chat"))
        output = await model.with_structured_output(Booking, include_raw=True).ainvoke([HumanMessage("2 nights, Oslo")])

    assert output["parsed"] == Booking(city="Oslo", nights=2)
    request = server.requests[0]
    # DeepSeek and most compatible servers take tools but not OpenAI's json_schema response format.
    assert "response_format" not in request
    assert [tool["function"]["name"] for tool in request["tools"]] == ["Booking"]
    assert _tokens(usage_from_message(output)) == _record(90, 12, 102)


# -- Anthropic over HTTP -----------------------------------------------------------------------------------


def _anthropic_message(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Bonjour."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


ANTHROPIC_USAGES = {
    # Anthropic's input_tokens leaves out the cache reads and writes.
    "cache read and write": (
        {
            "input_tokens": 50, "output_tokens": 200,
            "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 1000,
        },
        _record(3050, 200, 3250, cached=2000, created=1000),
    ),
    # Current responses also split the writes by cache lifetime.
    "writes split by lifetime": (
        {
            "input_tokens": 50, "output_tokens": 200, "cache_read_input_tokens": 2000,
            "cache_creation_input_tokens": 1000,
            "cache_creation": {"ephemeral_5m_input_tokens": 600, "ephemeral_1h_input_tokens": 400},
            "service_tier": "standard",
        },
        _record(3050, 200, 3250, cached=2000, created=1000),
    ),
    "no cache": ({"input_tokens": 12, "output_tokens": 5}, _record(12, 5, 17)),
}


@pytest.mark.parametrize("case", sorted(ANTHROPIC_USAGES))
async def test_anthropic_calls_the_messages_api_and_maps_its_usage(case: str) -> None:
    usage, expected = ANTHROPIC_USAGES[case]
    with RecordingServer([_anthropic_message(usage)]) as server:
        env = {"ANTHROPIC_API_KEY": "anthropic-key", "ANTHROPIC_BASE_URL": server.url}
        selection = ModelSelection(provider="anthropic", name="claude-sonnet-4-5", params={"max_tokens": 512})
        reply = await default_registry(env).chat_model(selection).ainvoke("Say hello in French.")

    assert reply.content == "Bonjour."
    assert server.paths == ["/v1/messages"]
    # The key travels as x-api-key, or as a bearer token with the newer clients.
    headers = server.headers[0]
    assert "anthropic-key" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert headers["anthropic-version"]
    assert server.requests[0]["model"] == "claude-sonnet-4-5"
    assert server.requests[0]["max_tokens"] == 512
    assert _tokens(usage_from_message(reply)) == expected


def test_anthropic_client_has_the_default_timeout_and_the_sdks_transport_retries() -> None:
    model = AnthropicProvider(api_key="k").chat_model(ModelSelection(provider="anthropic", name="claude-haiku-4-5"))

    assert model.default_request_timeout == DEFAULT_TIMEOUT_SECONDS
    assert model.max_retries == CLIENT_RETRIES
    assert model.anthropic_api_url == "https://api.anthropic.com"


# -- Google over HTTP --------------------------------------------------------------------------------------


def _gemini_response(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "Hallo."}]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": usage,
        "modelVersion": "gemini-2.5-flash",
    }


GOOGLE_USAGES = {
    # Gemini counts thinking apart from the candidates; both are billed as output.
    "thinking and cache": (
        {
            "promptTokenCount": 1000, "candidatesTokenCount": 100, "thoughtsTokenCount": 400,
            "cachedContentTokenCount": 600, "totalTokenCount": 1500,
        },
        _record(1000, 500, 1500, reasoning=400, cached=600),
    ),
    "plain": (
        {"promptTokenCount": 20, "candidatesTokenCount": 8, "totalTokenCount": 28},
        _record(20, 8, 28),
    ),
}


@pytest.mark.parametrize("case", sorted(GOOGLE_USAGES))
def test_google_calls_generate_content_and_maps_its_usage(case: str) -> None:
    usage, expected = GOOGLE_USAGES[case]
    with RecordingServer([_gemini_response(usage)]) as server:
        env = {"GEMINI_API_KEY": "gemini-key", "GOOGLE_BASE_URL": server.url}
        selection = ModelSelection(provider="google", name="gemini-2.5-flash", params={"max_tokens": 256})
        reply = default_registry(env).chat_model(selection).invoke("Say hello in German.")

    assert reply.content == "Hallo."
    (path,) = server.paths
    assert re.fullmatch(r"/v1(beta)?/models/gemini-2\.5-flash:generateContent", path)
    assert server.headers[0]["x-goog-api-key"] == "gemini-key"
    assert server.requests[0]["generationConfig"]["maxOutputTokens"] == 256
    assert _tokens(usage_from_message(reply)) == expected


def test_google_client_has_the_default_timeout_and_the_sdks_transport_retries() -> None:
    model = GoogleProvider(api_key="k").chat_model(ModelSelection(provider="google", name="gemini-2.5-flash"))

    assert model.timeout == DEFAULT_TIMEOUT_SECONDS
    # The Google client reads max_retries as attempts, the first included.
    assert model.max_retries == CLIENT_RETRIES + 1


# -- Bedrock through botocore --------------------------------------------------------------------------------


def _converse_response(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "Hej."}]}},
        "stopReason": "end_turn",
        "usage": usage,
        "metrics": {"latencyMs": 321},
    }


BEDROCK_USAGES = {
    # Converse's inputTokens leaves out the cache reads and writes.
    "cache read and write": (
        {
            "inputTokens": 30, "outputTokens": 200, "totalTokens": 2430,
            "cacheReadInputTokens": 2000, "cacheWriteInputTokens": 200,
        },
        _record(2230, 200, 2430, cached=2000, created=200),
    ),
    "writes split by lifetime": (
        {
            "inputTokens": 30, "outputTokens": 200, "totalTokens": 2430,
            "cacheReadInputTokens": 2000, "cacheWriteInputTokens": 200,
            "cacheDetails": [{"ttl": "5m", "inputTokens": 150}, {"ttl": "1h", "inputTokens": 50}],
        },
        _record(2230, 200, 2430, cached=2000, created=200),
    ),
    "no cache": ({"inputTokens": 25, "outputTokens": 9, "totalTokens": 34}, _record(25, 9, 34)),
}


@pytest.mark.parametrize("case", sorted(BEDROCK_USAGES))
def test_bedrock_calls_converse_and_maps_its_usage(case: str, aws_credentials: None) -> None:
    usage, expected = BEDROCK_USAGES[case]
    selection = ModelSelection(
        provider="bedrock", name="amazon.nova-lite-v1:0", params={"temperature": 0.2, "max_tokens": 300}
    )
    model = default_registry({"AWS_REGION": "eu-west-1"}).chat_model(selection)

    with Stubber(model.client) as stub:
        stub.add_response(
            "converse",
            _converse_response(usage),
            expected_params={
                "modelId": "amazon.nova-lite-v1:0",
                # Nova caches up to the cache point after the last message (picoflow.models.caching).
                "messages": [{"role": "user", "content": [{"text": "Say hello in Danish."}, {"cachePoint": ANY}]}],
                "inferenceConfig": {"temperature": 0.2, "maxTokens": 300},
                "system": ANY,
            },
        )
        reply = model.invoke("Say hello in Danish.")
        stub.assert_no_pending_responses()

    assert reply.content == "Hej."
    assert _tokens(usage_from_message(reply)) == expected


def test_bedrock_client_has_its_region_timeouts_and_botocores_transport_retries(aws_credentials: None) -> None:
    selection = ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0", params={"timeout": 20})
    model = BedrockProvider(environ={"AWS_DEFAULT_REGION": "us-west-2"}).chat_model(selection)
    config = model.client.meta.config

    assert model.client.meta.region_name == "us-west-2"
    assert (config.connect_timeout, config.read_timeout) == (10, 20)
    assert config.retries == {"total_max_attempts": CLIENT_RETRIES + 1, "mode": "standard"}


def test_bedrock_region_prefers_aws_region(aws_credentials: None) -> None:
    env = {"AWS_REGION": "eu-central-1", "AWS_DEFAULT_REGION": "us-east-1"}
    model = BedrockProvider(environ=env).chat_model(ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0"))

    assert model.client.meta.region_name == "eu-central-1"
    assert model.client.meta.config.read_timeout == DEFAULT_TIMEOUT_SECONDS


# -- usage normalisation, streamed or not ------------------------------------------------------------------


class _SplitCacheWrites(BaseChatModel):
    """Reports its cache writes split by lifetime, the way Anthropic's and Bedrock's integrations do."""

    @property
    def _llm_type(self) -> str:
        return "split-cache-writes"

    @staticmethod
    def _usage() -> dict[str, Any]:
        details = {"cache_read": 0, "cache_creation": 0, "ephemeral_5m_input_tokens": 6, "ephemeral_1h_input_tokens": 4}
        return {"input_tokens": 30, "output_tokens": 5, "total_tokens": 35, "input_token_details": details}

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        message = AIMessage(content="done", usage_metadata=self._usage())
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        yield ChatGenerationChunk(message=AIMessageChunk(content="do"))
        yield ChatGenerationChunk(message=AIMessageChunk(content="ne", usage_metadata=self._usage()))


async def test_split_cache_writes_count_as_cache_creation_in_every_call_style() -> None:
    model = usage_normalising(_SplitCacheWrites)()
    expected = _record(30, 5, 35, created=10)

    assert _tokens(usage_from_message(model.invoke("hi"))) == expected
    assert _tokens(usage_from_message(await model.ainvoke("hi"))) == expected
    streamed = None
    for chunk in model.stream("hi"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.content == "done"
    assert _tokens(usage_from_message(streamed)) == expected
    # Without the normalisation the split writes would be lost.
    assert usage_from_message(_SplitCacheWrites().invoke("hi")).cache_creation_input_tokens == 0


# -- the registry, missing credentials and packages, validation ----------------------------------------------


def test_the_default_registry_has_every_built_in_provider() -> None:
    assert default_registry({}).names() == BUILT_IN


def test_importing_picoflow_and_its_registry_loads_no_provider_package() -> None:
    code = (
        "import sys, picoflow\n"
        "from picoflow.models.factory import default_registry\n"
        "default_registry({})\n"
        "print([m for m in ('langchain_openai', 'langchain_anthropic', 'langchain_google_genai', 'langchain_aws')"
        " if m in sys.modules])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


MISSING_CREDENTIALS = {
    "openai": "no API key: .*OPENAI_API_KEY",
    "azure-openai": "no API key: .*AZURE_OPENAI_API_KEY",
    "deepseek": "no API key: .*DEEPSEEK_API_KEY",
    "moonshot": "no API key: .*MOONSHOT_API_KEY",
    "zai": "no API key: .*ZAI_API_KEY",
    "openrouter": "no API key: .*OPENROUTER_API_KEY",
    "anthropic": "no API key: .*ANTHROPIC_API_KEY",
    "google": r"no API key: .*GOOGLE_API_KEY \(or GEMINI_API_KEY\)",
    "bedrock": "no AWS Region: .*AWS_REGION",
}


@pytest.mark.parametrize("provider", sorted(MISSING_CREDENTIALS))
def test_a_missing_key_is_a_clear_error_naming_its_variable(provider: str) -> None:
    registry = default_registry({})
    selection = ModelSelection(provider=provider, name="gpt-4o" if provider == "openai" else "some-model")

    registry.validate(selection)  # validation stays offline: credentials are needed only to build a model
    with pytest.raises(PicoFlowError, match=f"Model provider '{provider}' has {MISSING_CREDENTIALS[provider]}"):
        registry.chat_model(selection)


def test_azure_needs_its_endpoint_and_api_version() -> None:
    selection = ModelSelection(provider="azure-openai", name="prod-gpt-4o")
    with pytest.raises(PicoFlowError, match="no endpoint: .*AZURE_OPENAI_ENDPOINT"):
        default_registry({"AZURE_OPENAI_API_KEY": "k"}).chat_model(selection)
    env = {"AZURE_OPENAI_API_KEY": "k", "AZURE_OPENAI_ENDPOINT": "https://example.openai.azure.com/"}
    with pytest.raises(PicoFlowError, match="no API version: .*OPENAI_API_VERSION"):
        default_registry(env).chat_model(selection)


@pytest.mark.parametrize(
    ("provider", "module", "extra"),
    [
        (AnthropicProvider(api_key="k"), "langchain_anthropic", "anthropic"),
        (GoogleProvider(api_key="k"), "langchain_google_genai", "google"),
        (BedrockProvider(region="eu-west-1"), "langchain_aws", "bedrock"),
    ],
)
def test_a_missing_optional_package_names_the_extra_to_install(
    provider: Any, module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail as if it were not installed
    package = module.replace("_", "-")

    with pytest.raises(PicoFlowError, match=rf"needs the {package} package: pip install 'picoflow\[{extra}\]'"):
        provider.chat_model(ModelSelection(provider=provider.name, name="some-model"))


def _pick(provider: str, name: str, **params: Any) -> ModelSelection:
    return ModelSelection(provider=provider, name=name, params=params)


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (_pick("deepseek", "deepseek-chat", api_key="sk"), "credentials"),
        (_pick("moonshot", "kimi-k2", base_url="http://x"), "endpoint"),
        (_pick("openrouter", "openai/gpt-4o", max_retries=3), "transport retries"),
        (_pick("zai", "glm-4.6", temperature=2.5), "from 0 to 2"),
        (_pick("azure-openai", "prod", azure_deployment="x"), "deployment"),
        (_pick("ollama", "llama3.2", max_tokens=0), "positive integer"),
        (_pick("openai", "gpt-5.9", temperature=0.5), "does not support temperature"),
        (_pick("opneai", "gpt-4o"), "model provider 'opneai' is not registered"),  # a wrong provider still fails
        (_pick("anthropic", "claude-sonnet-4-5", temperature=1.5), "from 0 to 1"),
        (_pick("anthropic", "claude-sonnet-4-5", top_k=0), "positive integer"),
        (_pick("anthropic", "claude-sonnet-4-5", thinking=True), "thinking must be an object"),
        (_pick("anthropic", "claude-sonnet-4-5", seed=1), r"does not accept parameter\(s\) seed"),
        (_pick("google", "gemini-2.5-flash", api_key="k"), "credentials"),
        (_pick("google", "gemini-2.5-flash", thinking_budget=-5), "thinking_budget"),
        (_pick("google", "gemini-2.5-flash", max_tokens=1, max_output_tokens=2), "both max_tokens and max_output"),
        (_pick("bedrock", "amazon.nova-lite-v1:0", temperature=1.2), "from 0 to 1"),
        (_pick("bedrock", "amazon.nova-lite-v1:0", region_name="x"), "AWS_REGION"),
        (_pick("bedrock", "amazon.nova-lite-v1:0", top_k=5), r"does not accept parameter\(s\) top_k"),
        (_pick("bedrock", "amazon.nova-lite-v1:0", guardrail_config="g"), "guardrail_config must be an object"),
    ],
)
def test_validation_rejects_bad_selections_with_clear_errors(selection: ModelSelection, message: str) -> None:
    with pytest.raises(PicoFlowError, match=message):
        default_registry({}).validate(selection)


@pytest.mark.parametrize(
    "selection",
    [
        ModelSelection(provider="deepseek", name="deepseek-reasoner", params={"max_tokens": 4000}),
        ModelSelection(provider="openrouter", name="meta-llama/llama-3.3-70b-instruct", params={"temperature": 0.7}),
        ModelSelection(provider="azure-openai", name="my-gpt-4o-deployment", params={"temperature": 0.2}),
        ModelSelection(provider="anthropic", name="claude-opus-4-1", params={"max_tokens": 4096, "temperature": 1}),
        ModelSelection(
            provider="anthropic",
            name="claude-sonnet-4-5",
            params={"max_tokens": 8000, "thinking": {"type": "enabled", "budget_tokens": 4000}},
        ),
        ModelSelection(provider="google", name="gemini-2.5-pro", params={"thinking_budget": -1, "max_tokens": 2048}),
        ModelSelection(
            provider="bedrock",
            name="us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            params={"max_tokens": 1024, "additional_model_request_fields": {"top_k": 50}},
        ),
    ],
)
def test_validation_accepts_good_selections(selection: ModelSelection) -> None:
    default_registry({}).validate(selection)


def test_an_application_registry_can_hold_any_subset() -> None:
    registry = ProviderRegistry([OpenAIProvider(name="deepseek", api_key="k"), AnthropicProvider(api_key="k")])

    assert registry.names() == ["deepseek", "anthropic"]
    model = registry.chat_model(ModelSelection(provider="deepseek", name="deepseek-chat"))
    assert str(model.root_client.base_url).rstrip("/") == "https://api.deepseek.com"
