"""Configuration errors are the operator's: a provider without its key, an unreadable key parameter or a model its
provider does not know answers 503 MODEL_NOT_CONFIGURED, writes nothing and names the setting in the logs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

import handlers.api as api
from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext
from picoflow.errors import PUBLIC_MESSAGES
from picoflow.local.cli import main
from picoflow.local.readiness import unconfigured_models
from picoflow.local.serve import LambdaHTTPServer
from picoflow.models.anthropic import AnthropicProvider
from picoflow.models.openai import OpenAIProvider
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.engine import text

ROOT = Path(__file__).resolve().parents[1]
CODE = "MODEL_NOT_CONFIGURED"


class AskStep(Step):
    def get_prompt(self) -> str:
        return "Ask the user which city they are travelling to."


class AskFlow(Flow):
    id = "AskFlow"

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [AskStep(self).use_memory("chat")]


class CountingStore(MemorySessionStore):
    """The memory store, counting every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return await super().create(*args, **kwargs)

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return await super().save(*args, **kwargs)

    async def insert(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return await super().insert(*args, **kwargs)


def engine_with(store: MemorySessionStore, registry: ProviderRegistry) -> FlowEngine:
    return FlowEngine(flows=[AskFlow], session_store=store, providers=registry, retry_delay=0)


def keyless() -> ProviderRegistry:
    return ProviderRegistry([OpenAIProvider(environ={})])


def assert_not_configured(response: Any) -> None:
    assert (response.success, response.status_code, response.error_code) == (False, 503, CODE)
    assert response.message == PUBLIC_MESSAGES[CODE]


async def test_a_provider_without_its_key_answers_503_and_writes_nothing(caplog):
    store = CountingStore()
    with caplog.at_level(logging.INFO):
        response = await engine_with(store, keyless()).run("AskFlow", "Hi")
    assert_not_configured(response)
    assert store.writes == 0 and response.session == ""
    (record,) = [r for r in caplog.records if r.getMessage() == "Turn failed"]
    assert (record.code, record.provider, record.setting) == (CODE, "openai", "OPENAI_API_KEY")


async def test_an_existing_session_is_left_as_it_was():
    store = CountingStore()
    scripted = ProviderRegistry([OpenAIProvider(environ={})], override=ScriptedProvider([text("Which city?")]))
    first = await engine_with(store, scripted).run("AskFlow", "Hi")
    assert first.success
    before = (await store.load(first.session)).to_json_dict()
    writes = store.writes

    failed = await engine_with(store, keyless()).run("AskFlow", "Lisbon", session_id=first.session)
    assert_not_configured(failed)
    assert failed.session == first.session
    assert store.writes == writes
    assert (await store.load(first.session)).to_json_dict() == before


async def test_a_model_the_provider_does_not_know_is_the_operators_error(caplog):
    store = CountingStore()
    unknown = {"error": "The model `gpt-4o-mini` does not exist or you do not have access to it.", "status": 404}
    registry = ProviderRegistry(override=ScriptedProvider([unknown]))
    with caplog.at_level(logging.INFO):
        response = await engine_with(store, registry).run("AskFlow", "Hi")
    assert_not_configured(response)
    assert store.writes == 0
    (record,) = [r for r in caplog.records if r.getMessage() == "Turn failed"]
    assert (record.provider, record.setting) == ("openai", "the model name")


def test_an_unreadable_key_parameter_answers_503_through_the_function(monkeypatch, caplog, aws_credentials):
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("OPENAI_API_KEY_PARAMETER", "/picoflow/openai-api-key")
    for name in ("OPENAI_API_KEY", "PICOFLOW_SCRIPT", "PICOFLOW_FLOWS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    event = json.loads((ROOT / "events" / "run-first-turn.json").read_text())
    try:
        with mock_aws(), caplog.at_level(logging.INFO):  # an account without that parameter
            result = api.lambda_handler(event, FakeLambdaContext())
    finally:
        if aws_runtime._runtime is not None:
            aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)
    body = json.loads(result["body"])
    assert result["statusCode"] == 503, body
    assert (body["success"], body["code"], body["message"]) == (False, CODE, PUBLIC_MESSAGES[CODE])
    (record,) = [r for r in caplog.records if r.getMessage() == "Turn failed"]
    assert (record.provider, record.setting) == ("openai", "OPENAI_API_KEY_PARAMETER")


def test_serve_warns_of_each_flow_whose_provider_has_no_key(monkeypatch, capsys):
    assert unconfigured_models([AskFlow], keyless()) == [
        "Flow AskFlow uses model provider 'openai', which has no OPENAI_API_KEY: its turns answer 503 "
        "MODEL_NOT_CONFIGURED until that is fixed."
    ]
    assert unconfigured_models([AskFlow], ProviderRegistry([OpenAIProvider(api_key="sk-test")])) == []
    assert unconfigured_models([AskFlow], ProviderRegistry([AnthropicProvider(environ={})])) == [
        "Flow AskFlow uses model provider 'openai', which is not registered: its turns answer 503 "
        "MODEL_NOT_CONFIGURED until that is fixed."
    ]
    assert unconfigured_models([AskFlow], ProviderRegistry(override=ScriptedProvider([]))) == []

    # serve sets some of these itself: each is restored afterwards.
    for name in ("SESSION_STORE", "PICOFLOW_FLOWS", "FILES_FOLDER", "OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER",
                 "PICOFLOW_SCRIPT"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setenv("SESSION_STORE", "MEMORY")

    def interrupted(self, poll_interval=0.5):
        raise KeyboardInterrupt

    monkeypatch.setattr(LambdaHTTPServer, "serve_forever", interrupted)
    assert main(["serve", "--port", "0", "--no-inspector", "--flows", __name__]) == 0
    err = capsys.readouterr().err
    assert "Warning: Flow AskFlow uses model provider 'openai', which has no OPENAI_API_KEY" in err

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0000")
    assert main(["serve", "--port", "0", "--no-inspector", "--flows", __name__]) == 0
    assert "Warning" not in capsys.readouterr().err


@pytest.fixture
def aws_credentials(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
