"""Idempotency-Key on POST /ai/run: replays, refusals and what is (not) kept, on moto with a scripted model."""

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import handlers.api as api
from picoflow import SessionConflictError, SessionStoreError
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.session.dynamodb_store import create_table
from tests.support import echo_flows
from tests.support.dynamodb_local import DynamoTable

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

IDEMPOTENCY_TABLE = "idempotency"


def reply(text: str, **extra: Any) -> dict[str, Any]:
    return {"content": text, "usage": {"input_tokens": 5, "output_tokens": 1}, **extra}


class Client:
    def __init__(self, table: DynamoTable, tmp_path, monkeypatch) -> None:
        self.table = table
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch

    def script(self, *replies: dict[str, Any]) -> None:
        """Serve exactly these model replies; one call more fails the turn."""
        path = self.tmp_path / "script.json"
        path.write_text(json.dumps(list(replies)))
        self.monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))

    def run(
        self,
        message: str | None = "hi",
        *,
        key: str | None = None,
        session: str | None = None,
        flow: str = "EchoFlow",
        config: dict | None = None,
        sub: str | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        body: dict[str, Any] = {"flowName": flow, "message": message}
        if config is not None:
            body["config"] = config
        headers = {"Idempotency-Key": key} if key is not None else {}
        if session:
            headers["CHAT_SESSION_ID"] = session
        event = http_event("POST", "/ai/run", body=body, headers=headers)
        if sub is not None:
            event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": sub}, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        response_headers = {k.lower(): v for k, v in result.get("headers", {}).items()}
        raw = result.get("body") or ""
        parsed = json.loads(raw) if response_headers.get("content-type") == "application/json" else raw
        return result["statusCode"], response_headers, parsed

    def model_calls(self) -> int:
        return len(api.get_engine().providers.override.calls)

    def sessions(self) -> list[dict]:
        return self.table.client.scan(TableName=self.table.name, ConsistentRead=True)["Items"]

    def records(self) -> list[dict]:
        return self.table.client.scan(TableName=IDEMPOTENCY_TABLE, ConsistentRead=True)["Items"]

    def revision(self, session: str) -> int:
        item = self.table.client.get_item(TableName=self.table.name, Key={"id": {"S": session}}, ConsistentRead=True)
        return int(item["Item"]["revision"]["N"])


@pytest.fixture
def client(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Client]:
    # Same key layout as the sessions table: ``id`` (S), on demand.
    create_table(moto_dynamodb.client, IDEMPOTENCY_TABLE)
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("IDEMPOTENCY_TABLE", IDEMPOTENCY_TABLE)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(api, "_runtime", None)
    yield Client(moto_dynamodb, tmp_path, monkeypatch)
    if api._runtime is not None:
        api._runtime.loop.call_soon_threadsafe(api._runtime.loop.stop)


def test_a_retry_gets_the_original_response_without_running_again(client):
    client.script(reply("only once"))
    first = client.run("book it", key="k-1", config={"tenantId": "demo"})
    status, headers, body = first
    assert status == 200 and body["message"] == "only once"
    session = body["session"]

    again = client.run("book it", key="k-1", config={"tenantId": "demo"})
    assert again[0] == 200 and again[2] == body
    assert again[1]["chat_session_id"] == session
    assert again[1]["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in headers
    assert client.model_calls() == 1
    assert client.revision(session) == 1
    assert len(client.sessions()) == 1


def test_the_key_is_scoped_by_the_session(client):
    client.script(reply("first"), reply("second"))
    _, _, first = client.run("hello", key="same")
    session = first["session"]
    status, _, second = client.run("and then", key="same", session=session)
    assert (status, second["message"], second["session"]) == (200, "second", session)
    assert client.revision(session) == 2

    assert client.run("and then", key="same", session=session)[2] == second
    assert client.model_calls() == 2
    assert client.revision(session) == 2


def test_the_key_is_scoped_by_the_jwt_subject(client):
    client.script(reply("for alice"), reply("for bob"))
    _, _, alice = client.run("hi", key="shared", sub="alice")
    _, _, bob = client.run("hi", key="shared", sub="bob")
    assert (alice["message"], bob["message"]) == ("for alice", "for bob")
    assert alice["session"] != bob["session"]
    assert client.run("hi", key="shared", sub="alice")[2] == alice
    assert client.model_calls() == 2


@pytest.mark.parametrize(
    "change",
    [{"message": "something else"}, {"config": {"tenantId": "other"}}, {"flow": "JsonFlow"}],
    ids=["message", "config", "flowName"],
)
def test_the_same_key_with_another_body_is_refused(client, change):
    client.script(reply("once"))
    _, _, first = client.run("hello", key="k-2", config={"tenantId": "demo"})
    request = {"message": "hello", "config": {"tenantId": "demo"}, **change}
    status, headers, body = client.run(request.pop("message"), key="k-2", **request)
    assert status == 422
    assert body == {
        "success": False,
        "completed": False,
        "message": "This Idempotency-Key was already used with a different request body.",
        "session": "",
        "code": "IDEMPOTENCY_KEY_MISMATCH",
    }
    assert "idempotent-replayed" not in headers
    assert client.model_calls() == 1
    assert client.revision(first["session"]) == 1


def test_a_duplicate_in_flight_is_told_to_retry_later(client):
    client.script(reply("slow", delay=1.0))
    results: list[tuple] = []
    first = threading.Thread(target=lambda: results.append(client.run("hello", key="k-3")))
    first.start()
    deadline = time.monotonic() + 5
    while not any(r["status"]["S"] == "INPROGRESS" for r in client.records()):
        assert time.monotonic() < deadline, "the first attempt never recorded itself"
        time.sleep(0.02)

    status, headers, body = client.run("hello", key="k-3")
    assert (status, body["code"], body["success"]) == (409, "IDEMPOTENCY_IN_PROGRESS", False)
    assert int(headers["retry-after"]) >= 1
    first.join(timeout=10)

    ((first_status, _, original),) = results
    assert first_status == 200 and original["message"] == "slow"
    assert client.run("hello", key="k-3")[2] == original
    assert client.model_calls() == 1


def test_a_failed_turn_is_not_kept_so_the_retry_runs(client, monkeypatch):
    client.script(reply("recovered"))
    store = api.get_engine().session_store
    create = store.create

    async def down_once(flow_doc):
        monkeypatch.setattr(store, "create", create)
        raise SessionStoreError("create", None, "throttled", status_code=503)

    monkeypatch.setattr(store, "create", down_once)
    status, _, body = client.run("hello", key="k-4")
    assert (status, body["code"]) == (503, "SESSION_STORE_ERROR")
    assert client.records() == []

    status, headers, body = client.run("hello", key="k-4")
    assert (status, body["message"]) == (200, "recovered")
    assert "idempotent-replayed" not in headers
    assert client.run("hello", key="k-4")[2] == body
    assert client.model_calls() == 1


def test_a_conflict_is_not_kept_so_the_retry_runs(client, monkeypatch):
    client.script(reply("first"), reply("lost the race"), reply("won"))
    _, _, first = client.run("hello")
    session = first["session"]
    store = api.get_engine().session_store
    save = store.save

    async def lose_once(doc, expected_revision):
        monkeypatch.setattr(store, "save", save)
        raise SessionConflictError(doc.id)

    monkeypatch.setattr(store, "save", lose_once)
    status, _, body = client.run("again", key="k-5", session=session)
    assert (status, body["code"]) == (409, "SESSION_CONFLICT")

    status, _, body = client.run("again", key="k-5", session=session)
    assert (status, body["message"]) == (200, "won")
    assert client.revision(session) == 2


def test_a_final_client_error_is_kept_and_replayed(client, monkeypatch):
    # A fresh document fits in 1000 bytes; the same one holding this incompressible reply does not.
    client.script(reply("".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(64))))
    monkeypatch.setattr(api.get_engine().session_store, "max_document_bytes", 1000)
    status, _, body = client.run("hello", key="k-6")
    assert (status, body["code"]) == (413, "SESSION_TOO_LARGE")

    again = client.run("hello", key="k-6")
    assert (again[0], again[2]) == (413, body)
    assert again[1]["idempotent-replayed"] == "true"
    assert client.model_calls() == 1


def test_a_raw_content_type_is_replayed_as_is(client):
    client.script(reply('{"rooms": 2}'))
    status, headers, body = client.run("rooms?", key="k-7", flow="JsonFlow")
    assert (status, headers["content-type"], body) == (200, "application/json", {"rooms": 2})
    again = client.run("rooms?", key="k-7", flow="JsonFlow")
    assert again[1]["content-type"] == "application/json"
    assert again[1]["chat_session_id"] == headers["chat_session_id"]
    assert again[2] == {"rooms": 2}
    assert client.model_calls() == 1


@pytest.mark.parametrize(
    "key",
    ["x" * 257, "ключ", "tab\tinside", "nul\x00", "", "   "],
    ids=["too-long", "non-ascii", "control", "nul", "empty", "blank"],
)
def test_a_malformed_key_is_400_and_touches_nothing(client, key):
    client.script()
    status, headers, body = client.run("hello", key=key)
    assert (status, body["code"], body["success"]) == (400, "BAD_REQUEST", False)
    assert "Idempotency-Key" in body["message"]
    assert client.sessions() == [] and client.records() == []


def test_the_longest_key_is_accepted(client):
    client.script(reply("ok"))
    assert client.run("hello", key="~" * api.MAX_IDEMPOTENCY_KEY_CHARS)[0] == 200


def test_without_a_table_the_header_is_checked_but_nothing_is_replayed(client, monkeypatch):
    monkeypatch.delenv("IDEMPOTENCY_TABLE")
    client.script(reply("one"), reply("two"))
    assert client.run("hello", key="k-8")[2]["message"] == "one"
    assert client.run("hello", key="k-8")[2]["message"] == "two"
    assert client.run("hello", key="x" * 300)[0] == 400
    assert client.records() == []


def test_an_unreachable_table_fails_closed(client, monkeypatch):
    monkeypatch.setenv("IDEMPOTENCY_TABLE", "no-such-table")
    client.script(reply("never"))
    status, headers, body = client.run("hello", key="k-9")
    assert (status, body["code"]) == (503, "IDEMPOTENCY_UNAVAILABLE")
    assert int(headers["retry-after"]) >= 1
    assert client.model_calls() == 0
    assert client.sessions() == []
    assert client.run("hello")[0] == 200
