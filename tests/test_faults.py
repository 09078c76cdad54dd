"""Faults through the Lambda handler: failing and slow models, a throttled, unreachable or flaky DynamoDB,
corrupted stored documents and a Lambda with no time left.

Each test drives ``handlers.api.lambda_handler`` with API Gateway events, as production does, and then
inspects the stored item directly to prove what was (not) written. Store faults are injected by
``FaultyDynamoDB``, a loopback endpoint that answers like DynamoDB or forwards to DynamoDB Local.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import handlers.api as api
from picoflow.aws import deadline
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import public_message
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.dynamodb_store import CLIENT_CONFIG
from tests.support.dynamodb_local import DynamoTable, free_port
from tests.support.faulty_dynamodb import FaultyDynamoDB

# Routes publish no metric when a request is refused early; Powertools warns about that.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

ACK = {"content": "ack", "usage": {"input_tokens": 10, "output_tokens": 2}}
#: Total attempts botocore makes per DynamoDB call, first try included, as the store configures it
#: (botocore's ``max_attempts`` would count the retries alone).
MAX_ATTEMPTS: int = CLIENT_CONFIG.retries.get("total_max_attempts") or CLIENT_CONFIG.retries["max_attempts"] + 1
#: The throttling answers of ``FaultyDynamoDB`` ask for at least this pause before a retry.
RETRY_AFTER_MS = 200
#: API Gateway's integration timeout: every answer must come well before it.
API_GATEWAY_TIMEOUT_SECONDS = 29.0

STORE_UNAVAILABLE = public_message("SESSION_STORE_ERROR")


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    elapsed: float
    #: Response headers, names in lower case.
    headers: dict[str, str]
    #: The Lambda request id of the invocation, which a failure envelope carries as ``requestId``.
    request_id: str


class Lambda:
    """Invokes the handler with API Gateway events and reads the sessions table behind its back."""

    def __init__(self, table: DynamoTable | None) -> None:
        self.table = table

    def run(self, message: str, session: str | None = None, *, timeout_ms: int = 25_000) -> Reply:
        headers = {"CHAT_SESSION_ID": session} if session else None
        event = http_event("POST", "/ai/run", body={"flowName": "TinyFlow", "message": message}, headers=headers)
        context = FakeLambdaContext(timeout_ms=timeout_ms)
        started = time.monotonic()
        result = api.lambda_handler(event, context)
        elapsed = time.monotonic() - started
        assert result["headers"]["Content-Type"] == "application/json"
        headers = {name.lower(): value for name, value in result["headers"].items()}
        return Reply(result["statusCode"], json.loads(result["body"]), elapsed, headers, context.aws_request_id)

    def model_calls(self) -> int:
        provider = aws_runtime.get_engine().providers.override
        assert isinstance(provider, ScriptedProvider)
        return len(provider.calls)

    def item(self, session: str) -> dict[str, Any] | None:
        assert self.table is not None
        response = self.table.client.get_item(
            TableName=self.table.name, Key={"id": {"S": session}}, ConsistentRead=True
        )
        return response.get("Item")

    def doc(self, session: str) -> dict[str, Any]:
        item = self.item(session)
        assert item is not None
        return json.loads(zlib.decompress(item["doc"]["B"]))

    def item_count(self) -> int:
        assert self.table is not None
        return self.table.client.scan(TableName=self.table.name, Select="COUNT", ConsistentRead=True)["Count"]


StartLambda = Callable[..., Lambda]


@pytest.fixture
def start_lambda(aws_credentials: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StartLambda]:
    """Configure a fresh Lambda container: the tiny flow, a model script and the DynamoDB store."""

    def start(table: DynamoTable | None, script: list[dict[str, Any]], *, endpoint_url: str | None = None) -> Lambda:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(script))
        monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
        monkeypatch.setenv("SESSION_TABLE", table.name if table is not None else "sessions-unreachable")
        endpoint = endpoint_url or (table.endpoint_url if table is not None else None)
        if endpoint:
            monkeypatch.setenv("DYNAMODB_ENDPOINT_URL", endpoint)
        else:
            monkeypatch.delenv("DYNAMODB_ENDPOINT_URL", raising=False)  # moto intercepts the default endpoint
        monkeypatch.setenv("PICOFLOW_FLOWS", "tests.support.tiny_flow")
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        return Lambda(table)

    yield start
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def assert_failure(reply: Reply, status: int, code: str) -> None:
    """A failure is the JSON envelope with a code, the code's fixed sentence and the request id, never a trace."""
    assert (reply.status, reply.body["code"]) == (status, code), reply
    assert reply.body["success"] is False and reply.body["completed"] is False
    assert reply.body["message"] == public_message(code)
    assert set(reply.body) == {"success", "completed", "message", "session", "code", "requestId"}
    assert reply.body["requestId"] == reply.request_id


def gaps(times: list[float]) -> list[float]:
    return [round(later - earlier, 3) for earlier, later in zip(times, times[1:], strict=False)]


# -- models --------------------------------------------------------------------------------------


def test_model_failing_every_attempt_is_502_and_keeps_the_session(
    moto_dynamodb: DynamoTable, start_lambda: StartLambda
) -> None:
    failures = [{"error": "upstream model exploded"}] * 3
    lam = start_lambda(moto_dynamodb, [ACK, *failures, ACK])
    session = lam.run("hello").body["session"]
    before = lam.item(session)

    reply = lam.run("again", session)

    assert_failure(reply, 502, "MODEL_UNAVAILABLE")
    assert reply.body["session"] == session and reply.headers["retry-after"] == "5"
    assert "upstream model exploded" not in json.dumps(reply.body)  # the upstream text stays in the logs
    # One call for the first turn, then the selection's whole retry budget (3 attempts) for the second.
    assert lam.model_calls() == 1 + 3
    print(f"\nfailing model: {reply.status} {reply.body['code']} after {reply.elapsed:.2f} s: {reply.body['message']}")
    # A transient model failure writes nothing: no new revision, not aborted, no partial work.
    assert lam.item(session) == before

    retry = lam.run("again", session)
    assert (retry.status, retry.body["message"], retry.body["session"]) == (200, "ack", session)
    doc = lam.doc(session)
    assert doc["runStatus"] == "running" and doc["revision"] == 2 and doc["error"] == []
    # The failed attempt's user message was not kept: the conversation holds the retried turn once.
    contents = [m["content"] for messages in doc["flow"]["memory"].values() for m in messages["messages"]]
    assert contents.count("again") == 1


def test_model_slower_than_the_turn_deadline_fails_cleanly_and_keeps_the_session(
    moto_dynamodb: DynamoTable, start_lambda: StartLambda
) -> None:
    lam = start_lambda(moto_dynamodb, [ACK, {"content": "too late", "delay": 60}, ACK])
    session = lam.run("hello").body["session"]
    before = lam.item(session)

    # The handler keeps deadline.DEADLINE_MARGIN_SECONDS of the Lambda's time back; the model call gets the rest.
    model_budget = 2.0
    lambda_timeout = deadline.DEADLINE_MARGIN_SECONDS + model_budget
    reply = lam.run("slow one", session, timeout_ms=int(lambda_timeout * 1000))

    assert_failure(reply, 504, "TURN_DEADLINE")
    assert reply.body["session"] == session
    # Answered inside the Lambda's own timeout, so well inside API Gateway's 29 s.
    assert model_budget <= reply.elapsed < lambda_timeout < API_GATEWAY_TIMEOUT_SECONDS
    assert lam.item(session) == before, "a timed-out turn must leave the stored session untouched"

    retry = lam.run("slow one", session)
    assert (retry.status, retry.body["message"], retry.body["session"]) == (200, "ack", session)
    doc = lam.doc(session)
    assert doc["runStatus"] == "running" and doc["revision"] == 2 and doc["error"] == []
    print(f"\nslow model: 504 after {reply.elapsed:.2f} s of a {lambda_timeout:.0f} s Lambda; retry 200 at revision 2")


# -- DynamoDB throttling and outages -----------------------------------------------------------------


@pytest.mark.parametrize("fault", ["throttle", "throughput"])
@pytest.mark.parametrize("operation", ["PutItem", "GetItem"])
def test_store_throttled_on_every_attempt_is_503_after_bounded_backoff(
    start_lambda: StartLambda, fault: str, operation: str
) -> None:
    with FaultyDynamoDB(retry_after_ms=RETRY_AFTER_MS) as fake:
        fake.plan[operation] = [fault] * 10
        lam = start_lambda(None, [ACK], endpoint_url=fake.endpoint_url)
        # A new session is written with one PutItem; a known id is first read with GetItem.
        reply = lam.run("hello", None if operation == "PutItem" else "some-session-id")

    assert_failure(reply, 503, "SESSION_STORE_ERROR")
    assert reply.body["message"] == STORE_UNAVAILABLE  # backend details stay in the logs
    attempts = fake.attempts(operation)
    assert fake.counts() == {operation: MAX_ATTEMPTS}
    # Backoff: each retry waited at least the server's retry-after hint (botocore honours x-amz-retry-after).
    assert all(gap >= RETRY_AFTER_MS / 1000 - 0.01 for gap in gaps(attempts)), gaps(attempts)
    # Bounded: jittered exponential backoff is at most 1 s + 2 s over two retries for throttling errors.
    assert reply.elapsed < 5.0
    # A known id is read before any model call; a new session meets the store only at its one write, after it.
    assert lam.model_calls() == (1 if operation == "PutItem" else 0)
    print(f"\n{operation} {fault}: {len(attempts)} attempts, gaps {gaps(attempts)} s, 503 after {reply.elapsed:.2f} s")


def test_throttle_that_clears_after_one_retry_succeeds(
    dynamodb_local_table: DynamoTable, start_lambda: StartLambda
) -> None:
    with FaultyDynamoDB(dynamodb_local_table.endpoint_url, retry_after_ms=RETRY_AFTER_MS) as fake:
        lam = start_lambda(dynamodb_local_table, [ACK, ACK], endpoint_url=fake.endpoint_url)
        session = lam.run("hello").body["session"]
        counts_before = fake.counts()
        fake.plan = {"GetItem": ["throughput"], "PutItem": ["throttle"]}

        reply = lam.run("again", session)

    assert (reply.status, reply.body["message"]) == (200, "ack")
    counts = fake.counts()
    assert counts["GetItem"] - counts_before.get("GetItem", 0) == 2
    assert counts["PutItem"] - counts_before["PutItem"] == 2
    doc = lam.doc(session)
    assert doc["revision"] == 2 and doc["runStatus"] == "running" and doc["error"] == []
    print(f"\nthrottled once: 200 after {reply.elapsed:.2f} s, requests {counts} (first turn: {counts_before})")


@pytest.mark.parametrize(
    ("fault", "code", "reads"),
    [
        # A refused write certainly did not land: the store error, after the turn's one read.
        pytest.param("throughput", "SESSION_STORE_ERROR", 1, id="throughput"),
        # A write cut off without an answer may still land: it is read back once, and as the stored item is
        # still the old one, the outcome is reported unknown (a keyed retry would learn it).
        pytest.param("drop", "SESSION_OUTCOME_UNKNOWN", 2, id="drop"),
    ],
)
def test_failed_save_leaves_the_stored_session_untouched(
    dynamodb_local_table: DynamoTable, start_lambda: StartLambda, fault: str, code: str, reads: int
) -> None:
    with FaultyDynamoDB(dynamodb_local_table.endpoint_url, retry_after_ms=RETRY_AFTER_MS) as fake:
        lam = start_lambda(dynamodb_local_table, [ACK, ACK], endpoint_url=fake.endpoint_url)
        session = lam.run("hello").body["session"]
        before = lam.item(session)
        puts_before = len(fake.attempts("PutItem"))
        gets_before = len(fake.attempts("GetItem"))
        # The read succeeds, the model answers, and then every write attempt is throttled or cut off.
        fake.plan = {"PutItem": [fault] * 10}

        reply = lam.run("again", session)

    assert_failure(reply, 503, code)
    assert reply.body["session"] == session
    # Exactly one bounded save: a store failure must not be followed by an attempt to save an "aborted" copy.
    assert len(fake.attempts("PutItem")) - puts_before == MAX_ATTEMPTS
    assert len(fake.attempts("GetItem")) - gets_before == reads
    assert lam.item(session) == before
    assert lam.model_calls() == 2
    saves = fake.attempts("PutItem")[puts_before:]
    print(f"\nsave {fault}: {len(saves)} PutItem attempts, gaps {gaps(saves)} s, 503 after {reply.elapsed:.2f} s")


@pytest.mark.parametrize("known_session", [False, True])
def test_unreachable_store_is_503_without_model_calls(start_lambda: StartLambda, known_session: bool) -> None:
    # Nothing listens on this loopback port: every connection is refused at once.
    lam = start_lambda(None, [ACK], endpoint_url=f"http://127.0.0.1:{free_port()}")

    reply = lam.run("hello", "some-session-id" if known_session else None)

    assert_failure(reply, 503, "SESSION_STORE_ERROR")
    assert reply.body["message"] == STORE_UNAVAILABLE and "127.0.0.1" not in reply.body["message"]
    assert reply.elapsed < 5.0
    # A continued session is read first; a new one meets the store only at its single write, after the model.
    assert lam.model_calls() == (0 if known_session else 1)
    print(f"\nunreachable store: 503 after {reply.elapsed:.2f} s: {reply.body['message']}")


# -- corrupted documents ------------------------------------------------------------------------------


def _two_flow_doc(doc: dict[str, Any]) -> bytes:
    broken = {key: value for key, value in doc.items() if key != "flow"}
    broken["flows"] = [doc["flow"], {**doc["flow"], "name": "OtherFlow"}]
    return zlib.compress(json.dumps(broken).encode("utf-8"))


CORRUPTIONS: dict[str, Callable[[dict[str, Any]], bytes | None]] = {
    "garbage-bytes": lambda doc: b"\x00\xffthis is not zlib data\x13\x37",
    "invalid-json": lambda doc: zlib.compress(b'{"id": "truncated", "flow": {"name": '),
    "json-not-an-object": lambda doc: zlib.compress(b'["a", "list"]'),
    "two-flows": _two_flow_doc,
    "doc-attribute-missing": lambda doc: None,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_document_is_409_and_left_for_inspection(
    moto_dynamodb: DynamoTable, start_lambda: StartLambda, corruption: str
) -> None:
    lam = start_lambda(moto_dynamodb, [ACK, ACK])
    session = lam.run("hello").body["session"]
    blob = CORRUPTIONS[corruption](lam.doc(session))
    key = {"id": {"S": session}}
    if blob is None:
        moto_dynamodb.client.update_item(TableName=moto_dynamodb.name, Key=key, UpdateExpression="REMOVE doc")
    else:
        moto_dynamodb.client.update_item(
            TableName=moto_dynamodb.name,
            Key=key,
            UpdateExpression="SET doc = :doc",
            ExpressionAttributeValues={":doc": {"B": blob}},
        )
    corrupted = lam.item(session)

    reply = lam.run("again", session)

    # The engine maps an unreadable or malformed stored document to SessionFlowInvariantError.
    assert_failure(reply, 409, "SESSION_FLOW_INVARIANT")
    assert reply.body["session"] == session
    print(f"\n{corruption}: {reply.body['message']}")
    assert lam.item(session) == corrupted, "the corrupted item must stay exactly as it was, for inspection"
    assert lam.model_calls() == 1


# -- Lambda deadline ------------------------------------------------------------------------------------


@pytest.mark.parametrize("known_session", [False, True])
def test_lambda_about_to_time_out_refuses_the_turn_at_once(
    moto_dynamodb: DynamoTable, start_lambda: StartLambda, known_session: bool
) -> None:
    lam = start_lambda(moto_dynamodb, [ACK, ACK])
    session = lam.run("hello").body["session"] if known_session else None
    before = lam.item(session) if session else None
    calls_before = lam.model_calls()

    # Less time left than the handler keeps back for the final save and the response.
    reply = lam.run("hi", session, timeout_ms=int(deadline.DEADLINE_MARGIN_SECONDS * 1000) - 500)

    assert_failure(reply, 504, "TURN_DEADLINE")
    assert reply.elapsed < 0.5
    assert lam.model_calls() == calls_before
    print(f"\nno time left: 504 after {reply.elapsed * 1000:.0f} ms")
    if session:
        assert lam.item(session) == before
    else:
        assert lam.item_count() == 0, "no session may be created for a turn that cannot run"
