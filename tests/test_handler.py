import io
import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

import handlers.api as api
from picoflow.aws import deadline, observability
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import ModelNotConfiguredError, SessionConflictError, SessionStoreError
from picoflow.models.registry import ModelSelection
from tests.support import echo_flows
from tests.support.dynamodb_local import REGION

# Routes such as /health publish no metric; Powertools warns about that on every call.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

SCRIPT = [{"content": f"reply {n}", "usage": {"input_tokens": 10, "output_tokens": 2}} for n in range(1, 9)]


class Api:
    def __init__(self, table) -> None:
        self.table = table
        #: The Lambda request id of the last call, which failure envelopes carry as ``requestId``.
        self.last_request_id = ""

    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None, *, event: dict | None = None,
             timeout_ms: int = 25_000) -> tuple[int, dict, Any]:
        event = event or http_event(method, path, body=body, headers=headers)
        context = FakeLambdaContext(timeout_ms=timeout_ms)
        self.last_request_id = context.aws_request_id
        result = api.lambda_handler(event, context)
        response_headers = {k.lower(): v for k, v in result.get("headers", {}).items()}
        raw = result.get("body") or ""
        parsed = json.loads(raw) if response_headers.get("content-type") == "application/json" else raw
        return result["statusCode"], response_headers, parsed

    def run(self, message: str | None = "hi", flow: str = "EchoFlow", session: str | None = None, **extra: Any):
        body = {"flowName": flow, **({"message": message} if message is not None else {}), **extra}
        return self.call("POST", "/ai/run", body, {"CHAT_SESSION_ID": session} if session else None)

    def items(self) -> list[dict]:
        return self.table.client.scan(TableName=self.table.name, ConsistentRead=True)["Items"]

    def revision(self, session: str) -> int:
        item = self.table.client.get_item(TableName=self.table.name, Key={"id": {"S": session}}, ConsistentRead=True)
        return int(item["Item"]["revision"]["N"])


@pytest.fixture
def client(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Api]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield Api(moto_dynamodb)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


@pytest.fixture
def log_stream(monkeypatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr(observability.logger.registered_handler, "stream", stream)
    return stream


def test_first_turn_creates_a_session(client):
    status, headers, body = client.run("hello", config={"tenantId": "demo"})
    assert status == 200
    assert body["success"] is True and body["completed"] is False
    assert body["message"] == "reply 1"
    assert body["contentType"] == "text/plain"
    assert body["session"] and headers["chat_session_id"] == body["session"]
    (item,) = client.items()
    assert item["id"]["S"] == body["session"]
    assert item["flowName"]["S"] == "EchoFlow"


@pytest.mark.parametrize("header", ["CHAT_SESSION_ID", "chat_session_id", "Chat_Session_Id", "chat-session-id"])
def test_session_header_is_matched_case_insensitively(client, header):
    _, _, first = client.run("hello")
    session = first["session"]
    event = http_event("POST", "/ai/run", body={"flowName": "EchoFlow", "message": "again"})
    event["headers"][header] = session  # as a proxy that keeps the client's spelling would deliver it
    status, headers, body = client.call("POST", "/ai/run", event=event)
    assert status == 200
    assert body["session"] == session and headers["chat_session_id"] == session
    assert body["message"] == "reply 2"
    assert len(client.items()) == 1
    assert client.revision(session) == 2


@pytest.mark.parametrize(
    "raw_body",
    [
        "{not json",
        "",
        "[1, 2]",
        '"text"',
        "{}",
        '{"flowName": 3}',
        '{"flowName": "  "}',
        '{"flowName": "EchoFlow", "config": [1]}',
        '{"flowName": "EchoFlow", "config": "x"}',
        '{"flowName": "EchoFlow", "message": {"a": 1}}',
        '{"flowName": "NoSuchFlow", "message": "hi"}',
    ],
)
def test_bad_requests_are_400_and_write_nothing(client, raw_body):
    status, _, body = client.call("POST", "/ai/run", raw_body, {"content-type": "application/json"})
    assert status == 400
    assert body["success"] is False and body["completed"] is False
    assert body["code"] in {"BAD_REQUEST", "FLOW_NOT_FOUND"}
    assert body["message"]
    assert set(body) == {"success", "completed", "message", "session", "code", "requestId"}
    assert body["requestId"] == client.last_request_id
    assert client.items() == []


@pytest.mark.parametrize("session", ["../etc/passwd", "a" * 129, "séance", "a b", "a,b", "x\r\nX-Injected: 1"])
def test_a_malformed_session_id_is_refused_before_any_store_call_and_not_echoed(client, monkeypatch, session):
    store = aws_runtime.get_engine().session_store

    async def untouchable(*args, **kwargs):
        raise AssertionError("the store was called")

    for name in ("load", "create", "save", "delete"):
        monkeypatch.setattr(store, name, untouchable)
    status, headers, body = client.run("hi", session=session)
    assert (status, body["code"], body["session"]) == (400, "BAD_REQUEST", "")
    assert "chat_session_id" not in headers
    status, headers, body = client.call("POST", "/ai/end", headers={"CHAT_SESSION_ID": session})
    assert (status, body["success"], body["session"]) == (400, False, "")
    assert "chat_session_id" not in headers


def test_overlong_message_is_413(client, monkeypatch):
    monkeypatch.setenv("PICOFLOW_MAX_MESSAGE_CHARS", "5")
    status, _, body = client.run("123456")
    assert (status, body["code"]) == (413, "MESSAGE_TOO_LARGE")
    assert client.items() == []
    assert client.run("12345")[0] == 200


def test_flow_mismatch_is_409_and_leaves_the_session(client):
    _, _, first = client.run("hello")
    session = first["session"]
    status, headers, body = client.run("x", flow="JsonFlow", session=session)
    assert status == 409
    assert body["code"] == "SESSION_FLOW_MISMATCH"
    assert body["session"] == session and headers["chat_session_id"] == session
    assert client.revision(session) == 1


def test_conflict_is_409(client, monkeypatch, capsys):
    _, _, first = client.run("hello")
    store = aws_runtime.get_engine().session_store

    async def lose_the_race(doc, expected_revision):
        raise SessionConflictError(doc.id)

    monkeypatch.setattr(store, "save", lose_the_race)
    capsys.readouterr()
    status, _, body = client.run("again", session=first["session"])
    assert (status, body["code"], body["success"], body["completed"]) == (409, "SESSION_CONFLICT", False, False)
    assert "SessionConflicts" in capsys.readouterr().out


@pytest.mark.parametrize("store_status", [500, 503])
def test_store_failures_keep_their_status(client, monkeypatch, store_status):
    store = aws_runtime.get_engine().session_store

    async def broken(session_id):
        raise SessionStoreError("load", session_id, "backend down", status_code=store_status)

    monkeypatch.setattr(store, "load", broken)
    status, _, body = client.run("hi", session="abc123")
    assert (status, body["code"]) == (store_status, "SESSION_STORE_ERROR")
    assert "Traceback" not in body["message"]


def test_oversized_document_is_413(client, monkeypatch):
    monkeypatch.setattr(aws_runtime.get_engine().session_store, "max_document_bytes", 64)
    status, _, body = client.run("hello")
    assert (status, body["code"]) == (413, "SESSION_TOO_LARGE")


def test_unexpected_error_is_a_500_envelope_without_trace(client, monkeypatch):
    async def explode(**kwargs):
        raise RuntimeError("internal detail")

    monkeypatch.setattr(aws_runtime.get_engine(), "run", explode)
    status, _, body = client.run("hi")
    assert status == 500
    assert body == {"success": False, "completed": False, "message": "Internal error.", "session": "",
                    "code": "INTERNAL_ERROR", "requestId": client.last_request_id}
    assert "internal detail" not in json.dumps(body)


def test_non_plain_content_type_returns_the_raw_message(client, tmp_path, monkeypatch):
    script = tmp_path / "json-script.json"
    script.write_text(json.dumps([{"content": '{"rooms": 2}'}]))
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    status, headers, body = client.run("rooms?", flow="JsonFlow")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert body == {"rooms": 2}
    assert headers["chat_session_id"]


def test_end_deletes_the_session(client):
    _, _, first = client.run("hello")
    session = first["session"]
    status, headers, body = client.call("POST", "/ai/end", headers={"CHAT_SESSION_ID": session})
    assert (status, body) == (200, {"success": True, "session": session})
    assert headers["chat_session_id"] == session
    assert client.items() == []


def test_end_without_a_session_is_a_no_op(client):
    status, headers, body = client.call("POST", "/ai/end")
    assert (status, body) == (200, {"success": True, "session": ""})
    assert "chat_session_id" not in headers


def test_end_with_an_invalid_session_is_400(client):
    status, _, body = client.call("POST", "/ai/end", headers={"CHAT_SESSION_ID": "not a valid id!"})
    assert status == 400
    assert body["success"] is False and body["code"] == "SESSION_DELETE_FAILED"


def test_flows_and_health(client):
    assert client.call("GET", "/ai/flows")[::2] == (200, ["EchoFlow", "JsonFlow"])
    assert client.call("GET", "/health")[::2] == (200, {"status": "ok"})


def test_unknown_route_is_a_404_envelope(client):
    status, _, body = client.call("GET", "/nope")
    assert (status, body["code"], body["success"]) == (404, "NOT_FOUND", False)


def test_logs_carry_the_session_but_never_the_message(client, log_stream):
    event = http_event(
        "POST", "/ai/run", body={"flowName": "EchoFlow", "message": "my secret plans for the weekend"},
        request_id="gw-request-1",
    )
    status, _, body = client.call("POST", "/ai/run", event=event)
    assert status == 200
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    turn = next(r for r in records if r["message"] == "Turn finished")
    # The session is named by a digest: the id itself would let a log reader continue the session.
    assert turn["session"] == observability.session_log_id(body["session"]) != body["session"]
    # The correlation id is API Gateway's request id, which joins these lines with the access log.
    assert turn["correlation_id"] == "gw-request-1"
    assert body["session"] not in log_stream.getvalue()
    assert turn["flow"] == "EchoFlow" and turn["success"] is True
    assert "secret plans" not in log_stream.getvalue()
    assert "reply 1" not in log_stream.getvalue()


def test_metrics_are_published(client, capsys):
    capsys.readouterr()
    client.run("hello")
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    names = {m["Name"] for doc in emf for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"Turns", "TurnLatency", "InputTokens", "OutputTokens"} <= names
    values = {k: v for doc in emf for k, v in doc.items() if k in ("InputTokens", "OutputTokens")}
    assert values == {"InputTokens": [10.0], "OutputTokens": [2.0]} or values == {"InputTokens": 10, "OutputTokens": 2}


def test_turn_deadline_comes_from_the_lambda_context(client, monkeypatch):
    seen = {}
    engine = aws_runtime.get_engine()
    original = engine.run

    async def spy(**kwargs):
        seen["remaining"] = kwargs["deadline"] - time.monotonic()
        return await original(**kwargs)

    monkeypatch.setattr(engine, "run", spy)
    client.call("POST", "/ai/run", {"flowName": "EchoFlow", "message": "hi"}, timeout_ms=10_000)
    assert 7.0 < seen["remaining"] <= 10.0 - deadline.DEADLINE_MARGIN_SECONDS


def test_openai_key_comes_from_ssm(client, monkeypatch):
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/picoflow/openai-api-key", Value="sk-test-123", Type="SecureString")
    monkeypatch.delenv("PICOFLOW_SCRIPT")
    monkeypatch.setenv("OPENAI_API_KEY_PARAMETER", "/picoflow/openai-api-key")
    engine = aws_runtime.build_engine()
    model = engine.providers.chat_model(ModelSelection(provider="openai", name="gpt-4o-mini"))
    assert model.openai_api_key.get_secret_value() == "sk-test-123"


def test_missing_key_parameter_is_logged_not_fatal(client, monkeypatch, log_stream):
    monkeypatch.delenv("PICOFLOW_SCRIPT")
    monkeypatch.setenv("OPENAI_API_KEY_PARAMETER", "/picoflow/absent")
    engine = aws_runtime.build_engine()
    assert engine.get_flow_names() == ["EchoFlow", "JsonFlow"]
    # Nothing is read until a model needs the key.
    assert "Cannot read a key parameter" not in log_stream.getvalue()
    with pytest.raises(ModelNotConfiguredError) as failure:
        engine.providers.chat_model(ModelSelection(provider="openai", name="gpt-4o-mini"))
    assert failure.value.setting == "OPENAI_API_KEY_PARAMETER"
    assert "Cannot read a key parameter" in log_stream.getvalue()
