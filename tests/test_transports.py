"""The store and the models reach their services only through the SDKs' public doors.

A botocore ``Stubber`` answers whole turns, botocore's event hooks see every request, the User-Agent names
PicoFlow, OpenTelemetry instrumentation sees every DynamoDB request and every model call, LangChain's
asynchronous callbacks run in the caller's loop, and transport retries are the SDK's (``Retry-After`` honoured,
never past the turn's deadline, never for a 401).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber
from langchain_core.callbacks import AsyncCallbackHandler

import handlers.api as api
from picoflow import FlowEngine
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import SessionConflictError
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ProviderRegistry
from picoflow.session.dynamodb_store import DynamoDBSessionStore, user_agent_extra
from picoflow.stores import MemorySessionStore
from tests.support import tiny_flow
from tests.support.dynamodb_local import REGION
from tests.support.engine import scripted_engine, text
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, usage_block

RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _reply(content: str = "Noted.") -> dict[str, Any]:
    return chat_completion(content=content, usage=usage_block(40, 5))


def _engine(server: FakeOpenAIServer, store: Any = None, provider: OpenAIProvider | None = None) -> FlowEngine:
    registry = ProviderRegistry()
    registry.register(provider or OpenAIProvider(api_key="test-key", base_url=server.url + "/v1"), replace=True)
    return FlowEngine(flows=[tiny_flow.TinyFlow], session_store=store or MemorySessionStore(), providers=registry)


# -- DynamoDB through botocore ------------------------------------------------------------------------


def _client() -> Any:
    return boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing").client(
        "dynamodb", region_name=REGION
    )


@pytest.mark.parametrize("given", [False, True], ids=["store-built-client", "given-client"])
async def test_a_stubber_on_the_stores_client_answers_whole_turns(given: bool, aws_credentials: None) -> None:
    store = DynamoDBSessionStore("sessions", client=_client()) if given else DynamoDBSessionStore("sessions")
    client = store.client
    written: list[dict[str, Any]] = []
    client.meta.events.register("provide-client-params.dynamodb.PutItem", lambda params, **_: written.append(params))
    engine, _ = scripted_engine([tiny_flow.TinyFlow], [text("one"), text("two")], store)
    put = {"TableName": "sessions", "Item": ANY, "ConditionExpression": ANY}

    with Stubber(client) as stubber:
        stubber.add_response("put_item", {}, put)  # the new session, written once by its first turn
        first = await engine.run("TinyFlow", "hello")
        stubber.assert_no_pending_responses()

        stored = written[-1]["Item"]
        stubber.add_response("get_item", {"Item": {"revision": stored["revision"], "doc": stored["doc"]}})
        stubber.add_response("put_item", {}, {**put, "ExpressionAttributeNames": ANY, "ExpressionAttributeValues": ANY})
        second = await engine.run("TinyFlow", "again", first.session)
        stubber.assert_no_pending_responses()

    assert (first.success, first.message) == (True, "one")
    assert (second.success, second.message) == (True, "two")
    assert written[-1]["Item"]["revision"] == {"N": str(int(stored["revision"]["N"]) + 1)}


async def test_every_request_fires_before_call_hooks_and_names_picoflow_in_the_user_agent(moto_dynamodb) -> None:
    store = DynamoDBSessionStore(moto_dynamodb.name, region_name=REGION)
    seen: list[tuple[str, str]] = []

    def before_call(model: Any, params: dict[str, Any], **_: Any) -> None:
        seen.append((model.name, params["headers"]["User-Agent"]))

    store.client.meta.events.register("before-call.dynamodb", before_call)
    engine, _ = scripted_engine([tiny_flow.TinyFlow], [text("one"), text("two")], store)

    first = await engine.run("TinyFlow", "hello")
    await engine.run("TinyFlow", "again", first.session)

    # One write per turn, the first included: the new session is created by its first turn's PutItem.
    assert [name for name, _ in seen] == ["PutItem", "GetItem", "PutItem"]
    assert all(user_agent_extra() in agent.split() for _, agent in seen)
    assert user_agent_extra().startswith("picoflow/")


async def test_a_lost_race_is_detected_through_the_modeled_exception(moto_dynamodb) -> None:
    store = DynamoDBSessionStore(moto_dynamodb.name, region_name=REGION)
    doc = await store.create({"name": "TinyFlow"})
    await store.save(doc, 0)

    with pytest.raises(SessionConflictError) as lost:
        await store.save(doc, 0)

    assert isinstance(lost.value.__context__, store.client.exceptions.ConditionalCheckFailedException)


def test_a_given_config_and_session_shape_the_client() -> None:
    session = boto3.session.Session(aws_access_key_id="a", aws_secret_access_key="b", region_name="eu-west-1")
    config = Config(retries={"mode": "adaptive", "total_max_attempts": 5}, read_timeout=9, user_agent_extra="shop/2")
    client = DynamoDBSessionStore("sessions", session=session, config=config).client

    assert client.meta.region_name == "eu-west-1"
    assert client.meta.config.retries["mode"] == "adaptive"
    assert client.meta.config.retries["total_max_attempts"] == 5
    assert client.meta.config.read_timeout == 9
    assert client.meta.config.connect_timeout == 2  # the store's default where the caller set nothing
    # (Other libraries, langchain-aws for one, may append their own marks after these.)
    assert client.meta.config.user_agent_extra.split()[:2] == ["shop/2", user_agent_extra()]
    with pytest.raises(ValueError, match="not both"):
        DynamoDBSessionStore("sessions", client=client, config=config)


# -- OpenAI through the SDK's public API ---------------------------------------------------------------


def test_tracing_sees_each_model_call_and_each_dynamodb_request(moto_dynamodb, monkeypatch, tmp_path) -> None:
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with FakeOpenAIServer([_reply("one"), _reply("two")]) as server:
        for name, value in {
            "SESSION_STORE": "DYNAMODB", "SESSION_TABLE": moto_dynamodb.name, "PICOFLOW_FLOWS": tiny_flow.__name__,
            "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": server.url + "/v1",
        }.items():
            monkeypatch.setenv(name, value)
        for name in ("PICOFLOW_SCRIPT", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        OpenAIInstrumentor().instrument(tracer_provider=provider)
        BotocoreInstrumentor().instrument(tracer_provider=provider)
        try:
            first = _handler_run("hello")
            second = _handler_run("again", first["session"])
        finally:
            OpenAIInstrumentor().uninstrument()
            BotocoreInstrumentor().uninstrument()
            aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)

    assert (first["message"], second["message"]) == ("one", "two")
    spans = exporter.get_finished_spans()
    model_spans = [span for span in spans if span.attributes.get("gen_ai.request.model")]
    assert len(server.requests) == 2
    assert [span.attributes["gen_ai.request.model"] for span in model_spans] == ["gpt-4o-mini", "gpt-4o-mini"]
    dynamodb = [span.name for span in spans if span.attributes.get("rpc.service") == "DynamoDB"]
    assert dynamodb == ["DynamoDB.PutItem", "DynamoDB.GetItem", "DynamoDB.PutItem"]


def _handler_run(message: str, session: str | None = None) -> dict[str, Any]:
    event = http_event("POST", "/ai/run", body={"flowName": "TinyFlow", "message": message},
                       headers={"CHAT_SESSION_ID": session} if session else None)
    result = api.lambda_handler(event, FakeLambdaContext(timeout_ms=25_000))
    assert result["statusCode"] == 200, result
    return json.loads(result["body"])


async def test_an_async_callback_handler_sees_every_model_call_in_the_callers_loop() -> None:
    class Recorder(AsyncCallbackHandler):
        def __init__(self) -> None:
            self.events: list[tuple[str, Any, threading.Thread]] = []

        async def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            self.events.append(("start", asyncio.get_running_loop(), threading.current_thread()))

        async def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
            self.events.append(("end", asyncio.get_running_loop(), threading.current_thread()))

    recorder = Recorder()

    class Traced(OpenAIProvider):
        def chat_model(self, selection: Any) -> Any:
            model = super().chat_model(selection)
            model.callbacks = [recorder]
            return model

    with FakeOpenAIServer([_reply("one"), _reply("two")]) as server:
        engine = _engine(server, provider=Traced(api_key="test-key", base_url=server.url + "/v1"))
        first = await engine.run("TinyFlow", "hello")
        await engine.run("TinyFlow", "again", first.session)

    loop, thread = asyncio.get_running_loop(), threading.current_thread()
    assert [name for name, _, _ in recorder.events] == ["start", "end", "start", "end"]
    assert all(seen_loop is loop and seen_thread is thread for _, seen_loop, seen_thread in recorder.events)


async def test_a_401_is_not_retried() -> None:
    unauthorized = (401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
    with FakeOpenAIServer([unauthorized, _reply(), _reply()]) as server:
        response = await _engine(server).run("TinyFlow", "hello")

    assert not response.success
    assert len(server.requests) == 1


async def test_a_server_error_is_retried_by_the_client() -> None:
    failure = (500, {"error": {"message": "upstream exploded", "type": "server_error"}}, {"Retry-After": "0"})
    with FakeOpenAIServer([failure, _reply("recovered")]) as server:
        response = await _engine(server).run("TinyFlow", "hello")

    assert (response.success, response.message) == (True, "recovered")
    assert len(server.requests) == 2


async def test_a_429_with_retry_after_is_waited_for_then_succeeds() -> None:
    with FakeOpenAIServer([(429, RATE_LIMITED, {"Retry-After": "1"}), _reply("after the wait")]) as server:
        started = time.monotonic()
        response = await _engine(server).run("TinyFlow", "hello", deadline=time.monotonic() + 20)
        elapsed = time.monotonic() - started

    assert (response.success, response.message) == (True, "after the wait")
    assert len(server.requests) == 2
    assert elapsed >= 0.95


async def test_a_429_whose_wait_would_pass_the_deadline_answers_model_throttled_before_it() -> None:
    with FakeOpenAIServer([(429, RATE_LIMITED, {"Retry-After": "30"}), _reply(), _reply(), _reply()]) as server:
        store = MemorySessionStore()
        engine = _engine(server, store)
        started = time.monotonic()
        response = await engine.run("TinyFlow", "hello", deadline=started + 5)
        elapsed = time.monotonic() - started

    assert (response.success, response.status_code, response.error_code) == (False, 503, "MODEL_THROTTLED")
    assert elapsed < 5
    assert len(server.requests) == 1  # neither the client nor PicoFlow tried again into the deadline
