"""Model keys in SSM Parameter Store: read through one Powertools reader with a max age, a failed read retried by
the next request, one read per turn, ``Retry-After`` on ``MODEL_NOT_CONFIGURED``, a rejected key answered as
``MODEL_AUTH_FAILED``.

Driven through the Lambda handler, on moto's SSM, against a local OpenAI-compatible server that records the key
each request carried.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

import handlers.api as api
from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import PUBLIC_MESSAGES
from picoflow.models import parameters
from picoflow.models.parameters import ParameterEnviron, max_age
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.memory_store import MemorySessionStore
from tests.support import echo_flows
from tests.support.dynamodb_local import REGION
from tests.support.fake_openai import FakeOpenAIServer, chat_completion

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

PARAMETER = "/picoflow/openai-api-key"
REJECTED = (401, {"error": {"message": "Incorrect API key provided: sk-old.", "type": "invalid_request_error"}})


class Function:
    """The handler with its key in SSM and its model at a local server; counts the SSM reads."""

    def __init__(self, server: FakeOpenAIServer) -> None:
        self.server = server
        self.ssm = boto3.client("ssm", region_name=REGION)
        self.reads = 0

    def put_key(self, value: str) -> None:
        self.ssm.put_parameter(Name=PARAMETER, Value=value, Type="SecureString", Overwrite=True)

    def turn(self) -> tuple[int, dict[str, str], dict[str, Any]]:
        event = http_event("POST", "/ai/run", body={"flowName": "EchoFlow", "message": "hi"})
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], result["headers"], json.loads(result["body"])

    def count_reads(self) -> None:
        """Count the GetParameter calls of the process's one reader."""
        parameters._ssm().client.meta.events.register("before-call.ssm.GetParameter", self._seen)

    def _seen(self, **_: Any) -> None:
        self.reads += 1

    def keys_sent(self) -> list[str]:
        return [{k.lower(): v for k, v in headers.items()}.get("authorization", "") for headers in self.server.headers]


@pytest.fixture
def function(monkeypatch: pytest.MonkeyPatch, aws_credentials: None) -> Iterator[Function]:
    replies: list[Any] = [chat_completion(content=f"reply {n}") for n in range(6)]
    with mock_aws(), FakeOpenAIServer(replies) as server:
        monkeypatch.setenv("SESSION_STORE", "MEMORY")
        monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
        monkeypatch.setenv("OPENAI_API_KEY_PARAMETER", PARAMETER)
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        for name in ("OPENAI_API_KEY", "PICOFLOW_SCRIPT", "PICOFLOW_PARAMETER_MAX_AGE", "DYNAMODB_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        aws_runtime.reset_runtime()
        counted = Function(server)
        counted.count_reads()
        yield counted
        aws_runtime.reset_runtime()


def test_a_missing_key_is_read_once_per_turn_and_read_again_by_the_next(function: Function,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    status, headers, body = function.turn()
    code = "MODEL_NOT_CONFIGURED"
    assert (status, body["code"], body["message"]) == (503, code, PUBLIC_MESSAGES[code])
    assert headers["Retry-After"] == "60"
    assert function.reads == 1  # not once per lookup
    assert function.server.requests == []

    # The operator creates the parameter; the same container answers the next request without a restart.
    function.put_key("sk-new")
    monkeypatch.setattr(parameters, "FAILED_READ_HOLD_SECONDS", 0.0)
    status, _, body = function.turn()
    assert (status, body["message"]) == (200, "reply 0")
    assert function.reads == 2 and function.keys_sent() == ["Bearer sk-new"]


def test_a_key_is_kept_for_its_max_age(function: Function) -> None:
    function.put_key("sk-one")
    assert function.turn()[0] == 200
    function.put_key("sk-two")
    assert function.turn()[0] == 200
    assert function.reads == 1 and function.keys_sent() == ["Bearer sk-one", "Bearer sk-one"]


def test_a_rotated_key_reaches_the_next_call_once_its_max_age_is_over(function: Function,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PICOFLOW_PARAMETER_MAX_AGE", "0")
    function.put_key("sk-one")
    assert function.turn()[0] == 200
    function.put_key("sk-two")
    assert function.turn()[0] == 200
    assert function.keys_sent() == ["Bearer sk-one", "Bearer sk-two"]


def test_a_rejected_key_is_model_auth_failed_and_read_again(
    function: Function, caplog: pytest.LogCaptureFixture
) -> None:
    function.server._responses[:0] = [REJECTED]
    function.put_key("sk-old")
    with caplog.at_level(logging.INFO):
        status, headers, body = function.turn()
    assert (status, body["code"]) == (503, "MODEL_AUTH_FAILED")
    assert body["message"] == "The model service refused this server's credentials; the session is unchanged."
    assert body["session"] == "" and headers["Retry-After"] == "60"
    assert "sk-old" not in json.dumps(body)
    (record,) = [r for r in caplog.records if r.getMessage() == "Turn failed"]
    assert (record.code, record.provider, record.setting) == ("MODEL_AUTH_FAILED", "openai", "the API key")

    # The kept value was dropped: the next turn reads the parameter again, and finds the new key.
    function.put_key("sk-new")
    status, _, _ = function.turn()
    assert status == 200 and function.reads == 2
    assert function.keys_sent() == ["Bearer sk-old", "Bearer sk-new"]


class AskStep(Step):
    def get_prompt(self) -> str:
        return "Ask."


class AskFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="ask", retry_attempts=3)

    def define_steps(self) -> list[Step]:
        return [AskStep(self)]


@pytest.mark.parametrize("status", [401, 403])
async def test_401_and_403_are_not_retried_and_write_nothing(status: int) -> None:
    provider = ScriptedProvider([{"error": "denied", "status": status}, {"content": "never"}])
    store = MemorySessionStore()
    response = await FlowEngine([AskFlow], store, [provider], retry_delay=0).run("AskFlow", "hi")
    assert (response.status_code, response.error_code, response.retry_after) == (503, "MODEL_AUTH_FAILED", 60)
    assert len(provider.calls) == 1 and response.session == ""


def test_max_age_comes_from_the_environment() -> None:
    assert max_age({}) == 300
    assert max_age({"PICOFLOW_PARAMETER_MAX_AGE": "0"}) == 0
    assert max_age({"PICOFLOW_PARAMETER_MAX_AGE": "45"}) == 45
    assert max_age({"PICOFLOW_PARAMETER_MAX_AGE": "soon"}) == 300


def test_the_environ_reads_nothing_until_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def read(name: str, *, environ: Any = None) -> str:
        asked.append(name)
        return "sk-from-ssm"

    monkeypatch.setattr(parameters, "secure_parameter", read)
    env = ParameterEnviron({"OPENAI_API_KEY_PARAMETER": "/k", "ANTHROPIC_API_KEY": "sk-plain"})
    assert sorted(env) == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY_PARAMETER"] and asked == []
    assert env.get("ANTHROPIC_API_KEY") == "sk-plain" and asked == []
    assert env.get("OPENAI_API_KEY") == "sk-from-ssm" and asked == ["/k"]
    assert env.get("GOOGLE_API_KEY") is None and env.get("OPENAI_API_KEY_PARAMETER_PARAMETER") is None
