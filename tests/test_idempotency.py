"""Idempotency-Key on POST /ai/run: replays, refusals and what is (not) applied, on moto with a scripted model.

The receipt of a keyed turn travels in the session item, in the same conditional write as the turn, so these
tests read the sessions table to prove what landed. The separate-process and slow-store timings run against
DynamoDB Local in ``test_retry_safety.py``.
"""

import hashlib
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import handlers.api as api
from picoflow.aws import idempotency
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import SessionConflictError, SessionStoreError, public_message
from picoflow.session import receipts
from tests.support import echo_flows
from tests.support.dynamodb_local import DynamoTable

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

def K(name: str) -> str:  # noqa: N802 - reads like the literal key it stands for
    """A key long enough for an anonymous first turn (see ``MIN_ANONYMOUS_KEY_CHARS``), named for the reader."""
    return f"{name}-".ljust(receipts.MIN_ANONYMOUS_KEY_CHARS, "0")


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
        return len(aws_runtime.get_engine().providers.override.calls)

    def sessions(self) -> list[dict]:
        return self.table.client.scan(TableName=self.table.name, ConsistentRead=True)["Items"]

    def doc(self, session: str) -> dict:
        item = self.table.client.get_item(TableName=self.table.name, Key={"id": {"S": session}}, ConsistentRead=True)
        return json.loads(zlib.decompress(item["Item"]["doc"]["B"]))

    def messages(self, session: str) -> list[tuple[str, str]]:
        memory = self.doc(session)["flow"]["memory"]
        return [(m["type"], m["content"]) for space in memory.values() for m in space["messages"]]

    def conversation(self, session: str) -> list[tuple[str, str]]:
        """The user's and the model's messages, in order (no system slot, no step-entry markers)."""
        user_or_model = [pair for pair in self.messages(session) if pair[0] in ("human", "ai")]
        return [pair for pair in user_or_model if pair != ("human", "Start")]

    def revision(self, session: str) -> int:
        item = self.table.client.get_item(TableName=self.table.name, Key={"id": {"S": session}}, ConsistentRead=True)
        return int(item["Item"]["revision"]["N"])


@pytest.fixture
def client(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Client]:
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield Client(moto_dynamodb, tmp_path, monkeypatch)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def test_a_retry_gets_the_original_response_without_running_again(client):
    client.script(reply("only once"))
    first = client.run("book it", key=K("k-1"), config={"tenantId": "demo"})
    status, headers, body = first
    assert status == 200 and body["message"] == "only once"
    session = body["session"]

    again = client.run("book it", key=K("k-1"), config={"tenantId": "demo"})
    assert again[0] == 200 and again[2] == body
    assert again[1]["chat_session_id"] == session
    assert again[1]["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in headers
    assert client.model_calls() == 1
    assert client.revision(session) == 1
    assert len(client.sessions()) == 1


def test_each_turn_of_a_session_has_its_own_key(client):
    client.script(reply("first"), reply("second"))
    _, _, first = client.run("hello", key=K("key-1"))
    session = first["session"]
    status, _, second = client.run("and then", key=K("key-2"), session=session)
    assert (status, second["message"], second["session"]) == (200, "second", session)
    assert client.run("and then", key=K("key-2"), session=session)[2] == second
    assert client.run("hello", key=K("key-1"))[2] == first
    assert client.model_calls() == 2
    assert client.revision(session) == 2
    assert client.conversation(session) == [
        ("human", "hello"), ("ai", "first"), ("human", "and then"), ("ai", "second"),
    ]


def test_a_key_reused_for_another_turn_of_the_session_is_refused(client):
    client.script(reply("first"))
    _, _, first = client.run("hello", key=K("same"))
    status, _, body = client.run("and then", key=K("same"), session=first["session"])
    assert (status, body["code"]) == (422, "IDEMPOTENCY_KEY_MISMATCH")
    assert client.revision(first["session"]) == 1 and client.model_calls() == 1


def test_the_key_is_scoped_by_the_jwt_subject(client):
    client.script(reply("for alice"), reply("for bob"))
    _, _, alice = client.run("hi", key=K("shared"), sub="alice")
    _, _, bob = client.run("hi", key=K("shared"), sub="bob")
    assert (alice["message"], bob["message"]) == ("for alice", "for bob")
    assert alice["session"] != bob["session"]
    assert client.run("hi", key=K("shared"), sub="alice")[2] == alice
    assert client.model_calls() == 2


@pytest.mark.parametrize(
    "change",
    [{"message": "something else"}, {"config": {"tenantId": "other"}}, {"flow": "JsonFlow"}],
    ids=["message", "config", "flowName"],
)
def test_the_same_key_with_another_body_is_refused(client, change):
    client.script(reply("once"))
    _, _, first = client.run("hello", key=K("k-2"), config={"tenantId": "demo"})
    request = {"message": "hello", "config": {"tenantId": "demo"}, **change}
    status, headers, body = client.run(request.pop("message"), key=K("k-2"), **request)
    assert status == 422
    assert body["requestId"]
    assert {k: v for k, v in body.items() if k != "requestId"} == {
        "success": False,
        "completed": False,
        "message": public_message("IDEMPOTENCY_KEY_MISMATCH"),
        "session": "",
        "code": "IDEMPOTENCY_KEY_MISMATCH",
    }
    assert "idempotent-replayed" not in headers
    assert client.model_calls() == 1
    assert client.revision(first["session"]) == 1


def test_a_duplicate_in_flight_waits_and_gets_the_same_answer(client):
    client.script(reply("slow", delay=1.0))
    results: list[tuple] = []
    threads = [threading.Thread(target=lambda: results.append(client.run("hello", key=K("k-3")))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    (s1, h1, b1), (s2, h2, b2) = results
    assert (s1, s2) == (200, 200) and b1 == b2 and b1["message"] == "slow"
    assert sorted([h1.get("idempotent-replayed"), h2.get("idempotent-replayed")], key=str) == [None, "true"]
    assert client.model_calls() == 1
    assert client.revision(b1["session"]) == 1 and len(client.sessions()) == 1


def test_a_transient_failure_spends_nothing_so_the_retry_runs(client, monkeypatch):
    # The first attempt's answer is lost with its write: the retry runs the turn again.
    client.script(reply("lost"), reply("recovered"))
    store = aws_runtime.get_engine().session_store
    insert = store.insert

    async def down_once(doc):
        # A new session is written once, by its first turn's insert.
        monkeypatch.setattr(store, "insert", insert)
        raise SessionStoreError("insert", doc.id, "throttled", status_code=503)

    monkeypatch.setattr(store, "insert", down_once)
    status, headers, body = client.run("hello", key=K("k-4"))
    assert (status, body["code"]) == (503, "SESSION_STORE_ERROR")
    assert int(headers["retry-after"]) >= 1
    assert client.sessions() == []

    status, headers, body = client.run("hello", key=K("k-4"))
    assert (status, body["message"]) == (200, "recovered")
    assert "idempotent-replayed" not in headers
    assert client.run("hello", key=K("k-4"))[2] == body
    assert client.model_calls() == 2


def test_a_lost_race_is_a_conflict_and_the_retry_runs(client, monkeypatch):
    client.script(reply("first"), reply("lost the race"), reply("won"))
    _, _, first = client.run("hello")
    session = first["session"]
    store = aws_runtime.get_engine().session_store
    save = store.save

    async def lose_once(doc, expected_revision):
        monkeypatch.setattr(store, "save", save)
        raise SessionConflictError(doc.id)

    monkeypatch.setattr(store, "save", lose_once)
    status, _, body = client.run("again", key=K("k-5"), session=session)
    assert (status, body["code"]) == (409, "SESSION_CONFLICT")
    assert client.revision(session) == 1

    status, _, body = client.run("again", key=K("k-5"), session=session)
    assert (status, body["message"]) == (200, "won")
    assert client.revision(session) == 2
    assert client.messages(session).count(("human", "again")) == 1


def test_a_save_whose_answer_was_lost_but_landed_is_a_success_and_replays(client, monkeypatch):
    client.script(reply("landed"))
    store = aws_runtime.get_engine().session_store
    save = store.save

    async def lands_then_times_out(doc, expected_revision):
        await save(doc, expected_revision)
        raise SessionStoreError("save", doc.id, "ReadTimeoutError: http://127.0.0.1/", status_code=503, ambiguous=True)

    monkeypatch.setattr(store, "save", lands_then_times_out)
    status, headers, body = client.run("hello", key=K("k-10"))
    assert (status, body["message"]) == (200, "landed")
    session = body["session"]
    again = client.run("hello", key=K("k-10"))
    assert (again[0], again[2], again[1]["idempotent-replayed"]) == (200, body, "true")
    assert client.model_calls() == 1 and client.revision(session) == 1
    assert client.conversation(session) == [("human", "hello"), ("ai", "landed")]


def test_a_save_whose_outcome_is_unknown_says_so_and_the_retry_applies_it_once(client, monkeypatch):
    client.script(reply("first"), reply("lost"), reply("second try"))
    _, _, first = client.run("hi")
    session = first["session"]
    store = aws_runtime.get_engine().session_store
    save = store.save

    async def never_answers(doc, expected_revision):
        monkeypatch.setattr(store, "save", save)
        raise SessionStoreError("save", doc.id, "ReadTimeoutError: http://127.0.0.1/", status_code=503, ambiguous=True)

    monkeypatch.setattr(store, "save", never_answers)
    status, headers, body = client.run("book", key=K("k-11"), session=session)
    assert (status, body["code"]) == (503, "SESSION_OUTCOME_UNKNOWN")
    assert body["message"] == public_message("SESSION_OUTCOME_UNKNOWN")
    assert int(headers["retry-after"]) >= 1
    assert client.revision(session) == 1

    status, _, body = client.run("book", key=K("k-11"), session=session)
    assert (status, body["message"]) == (200, "second try")
    assert client.revision(session) == 2
    assert client.messages(session).count(("human", "book")) == 1


def test_a_first_turn_that_never_landed_is_finished_by_its_retry_in_the_same_session(client, monkeypatch):
    client.script(reply("lost"), reply("kept"))
    store = aws_runtime.get_engine().session_store
    insert = store.insert

    async def down_once(doc):
        monkeypatch.setattr(store, "insert", insert)
        raise SessionStoreError("insert", doc.id, "ServiceUnavailable", status_code=503)

    monkeypatch.setattr(store, "insert", down_once)
    status, _, failed = client.run("hello", key=K("k-12"))
    assert (status, failed["code"]) == (503, "SESSION_STORE_ERROR")
    session = failed["session"]
    assert client.sessions() == []  # its only write did not land: nothing of the turn is stored

    status, _, body = client.run("hello", key=K("k-12"))
    assert (status, body["message"], body["session"]) == (200, "kept", session)
    assert client.revision(session) == 1 and len(client.sessions()) == 1
    assert client.conversation(session) == [("human", "hello"), ("ai", "kept")]


def test_a_too_large_turn_is_not_applied_so_its_retry_is_refused_again(client, monkeypatch):
    # A fresh document fits in 1000 bytes; the same one holding this incompressible reply does not.
    big = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(64))
    client.script(reply(big), reply(big))
    monkeypatch.setattr(aws_runtime.get_engine().session_store, "max_document_bytes", 1000)
    status, _, body = client.run("hello", key=K("k-6"))
    assert (status, body["code"]) == (413, "SESSION_TOO_LARGE")
    again = client.run("hello", key=K("k-6"))
    assert (again[0], again[2]["code"]) == (413, "SESSION_TOO_LARGE")
    assert "idempotent-replayed" not in again[1]
    assert client.sessions() == []  # the turn's one write was refused: nothing is stored


def test_a_key_whose_receipt_was_dropped_is_refused_rather_than_run_again(client, monkeypatch):
    monkeypatch.setattr(receipts, "MAX_RECEIPTS", 2)
    client.script(*(reply(f"answer {n}") for n in range(4)))
    _, _, first = client.run("turn 0", key=K("k-first"))
    session = first["session"]
    for n in (1, 2, 3):
        assert client.run(f"turn {n}", key=K(f"k-{n}"), session=session)[0] == 200
    assert len(client.doc(session)["_item"]["receipts"]) == 2

    status, _, body = client.run("turn 0", key=K("k-first"))
    assert (status, body["code"]) == (422, "IDEMPOTENCY_KEY_REUSED")
    assert client.model_calls() == 4 and client.revision(session) == 4


def test_the_stored_receipt_holds_digests_never_the_key(client):
    client.script(reply("ok"))
    key = "secret-key-material-0123456789abcdef"
    _, _, body = client.run("hello", key=key)
    item = client.table.client.get_item(
        TableName=client.table.name, Key={"id": {"S": body["session"]}}, ConsistentRead=True
    )["Item"]
    raw = zlib.decompress(item["doc"]["B"]).decode()
    assert key not in raw and key not in body["session"]
    (receipt,) = client.doc(body["session"])["_item"]["receipts"]
    assert receipt["key"] == receipts.key_digest(key) and receipt["response"]["message"] == "ok"


def test_a_raw_content_type_is_replayed_as_is(client):
    client.script(reply('{"rooms": 2}'))
    status, headers, body = client.run("rooms?", key=K("k-7"), flow="JsonFlow")
    assert (status, headers["content-type"], body) == (200, "application/json", {"rooms": 2})
    again = client.run("rooms?", key=K("k-7"), flow="JsonFlow")
    assert again[1]["content-type"] == "application/json"
    assert again[1]["chat_session_id"] == headers["chat_session_id"]
    assert again[1]["idempotent-replayed"] == "true"
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
    assert client.sessions() == []


def test_the_longest_key_is_accepted(client):
    client.script(reply("ok"))
    assert client.run("hello", key="~" * idempotency.MAX_IDEMPOTENCY_KEY_CHARS)[0] == 200


def test_without_a_key_every_request_is_a_new_turn(client):
    client.script(reply("one"), reply("two"))
    assert client.run("hello")[2]["message"] == "one"
    assert client.run("hello")[2]["message"] == "two"
    assert len(client.sessions()) == 2


def test_an_anonymous_first_turn_needs_a_key_no_other_client_could_pick(client):
    client.script(reply("signed in"), reply("anonymous"), reply("next"))
    status, _, body = client.run("hello", key="k-1")
    assert (status, body["code"]) == (400, "IDEMPOTENCY_KEY_TOO_WEAK")
    assert body["message"] == public_message("IDEMPOTENCY_KEY_TOO_WEAK") and client.sessions() == []

    # A signed-in caller's keys are scoped by its principal, so a short one is fine.
    assert client.run("hello", key="k-1", sub="alice")[0] == 200
    _, _, first = client.run("hello", key=K("k-2"))
    # Inside an existing session a key only has to be unique to that session.
    assert client.run("next", key="k-3", session=first["session"])[0] == 200


def test_two_anonymous_clients_with_different_keys_get_two_sessions(client):
    client.script(reply("one"), reply("two"))
    _, _, a = client.run("hello", key="6b0b1f4e-0d5c-4f61-9c35-3f2f5a0c9d11")
    _, _, b = client.run("hello", key="0f8d9c7e-2a1b-4c3d-8e5f-6a7b8c9d0e1f")
    assert a["session"] != b["session"] and (a["message"], b["message"]) == ("one", "two")
