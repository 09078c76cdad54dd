"""Who may touch a session, and what a request may switch: ownership, reserved config, model text, CORS.

Driven through the Lambda handler with API Gateway events carrying (or not) the JWT authorizer's claims,
on moto, with a scripted model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import handlers.api as api
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.aws import cors
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from tests.support import echo_flows
from tests.support.engine import scripted_engine, text

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


class Caller:
    def __init__(self, table, tmp_path, monkeypatch) -> None:
        self.table, self.tmp_path, self.monkeypatch = table, tmp_path, monkeypatch

    def script(self, *replies: str) -> None:
        path = self.tmp_path / "script.json"
        path.write_text(json.dumps([{"content": reply} for reply in replies]))
        self.monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        self.monkeypatch.setattr(aws_runtime, "_runtime", None)

    def post(self, path: str, body: Any = None, *, session: str | None = None, claims: dict | None = None,
             key: str | None = None) -> tuple[int, dict[str, str], Any]:
        headers = {"CHAT_SESSION_ID": session} if session else {}
        if key:
            headers["Idempotency-Key"] = key
        event = http_event("POST", path, body=body, headers=headers)
        if claims is not None:
            event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], {k.lower(): v for k, v in result["headers"].items()}, json.loads(result["body"])

    def run(self, message: str, **kwargs: Any) -> tuple[int, dict[str, str], Any]:
        return self.post("/ai/run", {"flowName": "EchoFlow", "message": message}, **kwargs)

    def end(self, session: str, **kwargs: Any) -> tuple[int, dict[str, str], Any]:
        return self.post("/ai/end", session=session, **kwargs)

    def model_inputs(self) -> str:
        return str(aws_runtime.get_engine().providers.override.calls[-1])

    def stored(self, session: str) -> dict | None:
        return self.table.client.get_item(TableName=self.table.name, Key={"id": {"S": session}}).get("Item")


@pytest.fixture
def caller(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Caller]:
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "PICOFLOW_PRINCIPAL_CLAIM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield Caller(moto_dynamodb, tmp_path, monkeypatch)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


ALICE = {"sub": "alice-123", "email": "alice@example.com"}
BOB = {"sub": "bob-456", "email": "bob@example.com"}


def test_a_second_principal_can_neither_continue_read_nor_end_anothers_session(caller):
    caller.script("hello alice", "hello stranger", "hello anonymous", "welcome back")
    _, _, first = caller.run("my account number is 4111", claims=ALICE)
    alice = first["session"]
    item_before = caller.stored(alice)

    for claims in (BOB, None):
        status, headers, body = caller.run("repeat what I told you", session=alice, claims=claims)
        assert status == 200 and body["session"] != alice and headers["chat_session_id"] != alice
        assert "4111" not in caller.model_inputs()

        status, _, gone = caller.end(alice, claims=claims)
        status_unknown, _, unknown = caller.end("0123456789abcdef0123456789abcdef", claims=claims)
        assert (status, status_unknown) == (404, 404)
        assert {k: v for k, v in gone.items() if k not in ("session", "requestId")} == {
            k: v for k, v in unknown.items() if k not in ("session", "requestId")
        }
    assert caller.stored(alice) == item_before

    status, _, again = caller.run("what is my account number?", session=alice, claims=ALICE)
    assert (status, again["session"], again["message"]) == (200, alice, "welcome back")
    assert "4111" in caller.model_inputs()
    assert caller.end(alice, claims=ALICE)[0] == 200 and caller.stored(alice) is None


def test_the_owner_claim_is_configurable(caller, monkeypatch):
    monkeypatch.setenv("PICOFLOW_PRINCIPAL_CLAIM", "email")
    caller.script("hi", "again", "other")
    _, _, first = caller.run("hi", claims={"sub": "shared-sub", "email": "a@example.com"})
    same_email = caller.run("again", session=first["session"], claims={"sub": "other", "email": "a@example.com"})
    assert same_email[2]["session"] == first["session"]
    other_email = caller.run("again", session=first["session"], claims={"sub": "shared-sub", "email": "b@x.com"})
    assert other_email[2]["session"] != first["session"]


def test_an_anonymous_session_is_open_to_anyone_with_its_id(caller):
    caller.script("one", "two")
    _, _, first = caller.run("hi")
    status, _, body = caller.run("hi again", session=first["session"], claims=BOB)
    assert (status, body["session"]) == (200, first["session"])
    assert caller.end(first["session"])[0] == 200


def test_the_same_key_and_body_from_two_principals_are_two_turns(caller):
    caller.script("for alice", "for bob")
    _, _, alice = caller.run("hi", claims=ALICE, key="k-1")
    _, headers, bob = caller.run("hi", claims=BOB, key="k-1")
    assert alice["session"] != bob["session"] and bob["message"] == "for bob"
    assert "idempotent-replayed" not in headers


@pytest.mark.parametrize(
    "config",
    [{"_concurrent": True}, {"tenantId": "t", "_debug": 1}],
    ids=["batch-switch", "any-underscore-key"],
)
def test_reserved_config_keys_are_refused_and_touch_nothing(caller, config):
    caller.script("never")
    status, _, body = caller.post("/ai/run", {"flowName": "EchoFlow", "message": "hi", "config": config})
    assert (status, body["code"]) == (400, "BAD_REQUEST") and "reserved" in body["message"]
    assert caller.table.client.scan(TableName=caller.table.name)["Items"] == []


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_config_are_refused(caller, constant):
    caller.script("never")
    raw = '{"flowName": "EchoFlow", "message": "hi", "config": {"rate": ' + constant + "}}"
    event = http_event("POST", "/ai/run", body=raw)
    result = api.lambda_handler(event, FakeLambdaContext())
    assert result["statusCode"] == 400 and json.loads(result["body"])["code"] == "BAD_REQUEST"


async def test_the_engine_refuses_nan_in_config_too():
    engine, _ = scripted_engine([echo_flows.EchoFlow], [text("never")])
    response = await engine.run("EchoFlow", "hi", config={"rate": float("nan")})
    assert (response.status_code, response.error_code) == (400, "BAD_REQUEST")


class AskStep(Step):
    def get_prompt(self) -> str:
        return "Answer."


class ShortcutStep(Step):
    async def on_response(self, result: Any) -> Any:
        # Flow code that routes on purpose, by returning a step name of its own making.
        return "TerminateSessionStep" if result == "bye" else result


class ModelTextFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [AskStep(self), ShortcutStep(self), TerminateSessionStep(self)]


class ShortcutFlow(ModelTextFlow):
    def initial_step(self) -> type[Step]:
        return ShortcutStep


class PrivateConfigFlow(ModelTextFlow):
    allowed_private_config = frozenset({"_tenant"})


async def test_a_reply_that_spells_a_step_name_does_not_move_the_cursor():
    engine, _ = scripted_engine([ModelTextFlow], [text("TerminateSessionStep"), text("ShortcutStep")])
    first = await engine.run("ModelTextFlow", "say the magic word")
    assert (first.success, first.completed, first.message) == (True, False, "TerminateSessionStep")
    second = await engine.run("ModelTextFlow", "and another", session_id=first.session)
    doc = await engine.session_store.load(first.session)
    assert second.message == "ShortcutStep" and doc.flow.current_step == "AskStep" and doc.run_status == "running"


async def test_flow_code_can_still_route_on_a_reply_explicitly():
    engine, _ = scripted_engine([ShortcutFlow], [text("bye"), text("goodbye")])
    response = await engine.run("ShortcutFlow", "bye")
    assert response.success
    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "TerminateSessionStep"


async def test_a_flow_may_accept_the_private_keys_it_lists():
    engine, _ = scripted_engine([PrivateConfigFlow], [text("ok")])
    accepted = await engine.run("PrivateConfigFlow", "hi", config={"_tenant": "acme"})
    refused = await engine.run("PrivateConfigFlow", "hi", config={"_other": 1})
    assert accepted.success and refused.error_code == "BAD_REQUEST"


def test_cors_preflight_and_exposed_headers_when_an_origin_is_allowed(monkeypatch):
    config = cors.cors_config({"CORS_ALLOW_ORIGIN": "https://app.example.com, http://localhost:5173"})
    assert config is not None and cors.cors_config({}) is None
    assert config._allowed_origins == ["https://app.example.com", "http://localhost:5173"]
    assert {"chat_session_id", "idempotent-replayed", "retry-after"} <= set(config.expose_headers)
    assert {"chat_session_id", "idempotency-key", "content-type", "authorization"} <= set(config.allow_headers)
    assert config.allow_credentials is False
