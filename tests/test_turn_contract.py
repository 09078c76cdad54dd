"""The failure policy of a turn: what keeps the session, what aborts it, and what a client may read.

Transient failures (the model, the store, the deadline) leave the stored document as the request found it
(or as a restore hook migrated it, which the answer then says) and answer a retryable code; only a defect in
flow code aborts the session, unless the flow keeps it. No response ever carries exception text: every failure
is a fixed sentence per code plus a request id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import handlers.api as api
from picoflow import FlowEngine, ModelSelection
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import PUBLIC_MESSAGES, RETRY_AFTER_SECONDS, SessionStoreError, public_message
from picoflow.models.bedrock import BEDROCK_VOCABULARY
from picoflow.stores import MemorySessionStore
from picoflow.turn.model_call import Failure
from tests.support import faulty_flows
from tests.support.engine import call, scripted_engine, text
from tests.support.faulty_flows import MARKER, FaultyFlow, KeepingFlow

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


@pytest.fixture(autouse=True)
def nothing_fails() -> Iterator[None]:
    FaultyFlow.failing = set()
    yield
    FaultyFlow.failing = set()


def model_error(text_: str = "upstream 500") -> dict[str, Any]:
    return {"error": f"{MARKER} {text_}"}


async def stored(engine: FlowEngine, session: str) -> tuple[int, str, dict[str, Any]]:
    doc = await engine.session_store.load(session)
    assert doc is not None
    return doc.revision, doc.run_status, doc.to_json_dict()


# -- transient failures keep the session ---------------------------------------------------------


async def test_a_model_that_fails_every_attempt_keeps_the_session_and_the_retry_continues_it():
    engine, model = scripted_engine([FaultyFlow], [text("hello"), *[model_error()] * 3, text("welcome back")])
    first = await engine.run("FaultyFlow", "hi")
    before = await stored(engine, first.session)

    failed = await engine.run("FaultyFlow", "book a room", session_id=first.session)
    assert (failed.success, failed.status_code, failed.error_code) == (False, 502, "MODEL_UNAVAILABLE")
    assert failed.session == first.session and failed.retry_after and failed.retry_after > 0
    assert failed.message == public_message("MODEL_UNAVAILABLE") and MARKER not in failed.message
    assert MARKER in (failed.detail or "")
    assert await stored(engine, first.session) == before  # no revision, not aborted, byte for byte

    again = await engine.run("FaultyFlow", "book a room", session_id=first.session)
    assert (again.success, again.message, again.session) == (True, "welcome back", first.session)
    revision, status, doc = await stored(engine, first.session)
    assert (revision, status) == (2, "running")
    contents = [m["content"] for m in doc["flow"]["memory"]["chat"]["messages"]]
    assert contents.count("hi") == contents.count("book a room") == 1 and "hello" in contents
    assert len(model.calls) == 5


async def test_a_model_timeout_is_504_and_keeps_the_session():
    class Impatient(FaultyFlow):
        def config_llm_call_policy(self) -> dict[str, Any]:
            return {"timeout_ms": 50}

    slow = {"content": "too late", "delay": 1.0}
    engine, _ = scripted_engine([Impatient], [text("hello"), slow, slow, slow])
    first = await engine.run("Impatient", "hi")
    before = await stored(engine, first.session)
    failed = await engine.run("Impatient", "again", session_id=first.session)
    assert (failed.status_code, failed.error_code) == (504, "MODEL_TIMEOUT")
    assert await stored(engine, first.session) == before


def test_a_throttled_model_is_503_and_other_failures_502():
    class RateLimited(Exception):
        status_code = 429

    class ClientError(Exception):  # the shape of botocore's, as Bedrock raises it
        response = {"Error": {"Code": "ThrottlingException", "Message": "Too many requests"}}

    selection = ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0")
    words = BEDROCK_VOCABULARY
    botocore = Failure("invocation_error", "error", "x", 3, ClientError()).as_error(selection, words)
    assert botocore.code == "MODEL_THROTTLED"
    throttled = Failure("invocation_error", "error", "429", 3, RateLimited()).as_error(selection, words)
    failing = Failure("invocation_error", "error", "500", 3, RuntimeError()).as_error(selection, words)
    assert (throttled.code, throttled.status_code) == ("MODEL_THROTTLED", 503)
    assert (failing.code, failing.status_code) == ("MODEL_UNAVAILABLE", 502)


async def test_a_failed_first_turn_leaves_a_session_whose_retry_runs_as_the_first_turn():
    FaultyFlow.failing = set()
    engine, _ = scripted_engine([FaultyFlow], [*[model_error()] * 3, text("hello")])
    failed = await engine.run("FaultyFlow", "hi")
    assert failed.error_code == "MODEL_UNAVAILABLE" and failed.session
    assert (await stored(engine, failed.session))[0] == 0

    retried = await engine.run("FaultyFlow", "hi", session_id=failed.session)
    assert (retried.success, retried.session, retried.message) == (True, failed.session, "hello")
    revision, _, doc = await stored(engine, failed.session)
    contents = [m["content"] for m in doc["flow"]["memory"]["chat"]["messages"] if m["type"] == "human"]
    assert revision == 1 and contents.count("hi") == 1


async def test_a_store_outage_on_save_keeps_the_stored_session(monkeypatch):
    engine, _ = scripted_engine([FaultyFlow], [text("hello"), text("lost")])
    first = await engine.run("FaultyFlow", "hi")
    before = await stored(engine, first.session)

    async def down(doc, expected_revision):
        raise SessionStoreError("save", doc.id, f"{MARKER} https://dynamodb.internal/sessions", status_code=503)

    monkeypatch.setattr(engine.session_store, "save", down)
    failed = await engine.run("FaultyFlow", "again", session_id=first.session)
    assert (failed.status_code, failed.error_code, failed.retry_after) == (503, "SESSION_STORE_ERROR", 2)
    assert MARKER not in failed.message
    monkeypatch.undo()
    assert await stored(engine, first.session) == before


# -- defects in flow code ------------------------------------------------------------------------


async def test_a_raising_tool_handler_aborts_the_session_and_records_why():
    FaultyFlow.failing = {"tool"}
    engine, _ = scripted_engine([FaultyFlow], [text("hello"), call(("explode", {})), text("new")])
    first = await engine.run("FaultyFlow", "hi")
    failed = await engine.run("FaultyFlow", "explode", session_id=first.session)
    assert (failed.status_code, failed.error_code) == (500, "TURN_FAILED")
    assert failed.message == public_message("TURN_FAILED") and failed.retry_after is None
    revision, status, doc = await stored(engine, first.session)
    assert (revision, status) == (2, "aborted")
    (entry,) = doc["error"]
    assert MARKER in entry["message"] and entry["requestId"] == failed.request_id

    # An aborted session is over: the same id starts a new conversation (documented).
    FaultyFlow.failing = set()
    fresh = await engine.run("FaultyFlow", "hi again", session_id=first.session)
    assert fresh.success and fresh.session != first.session


async def test_a_flow_can_keep_its_session_when_its_code_raises():
    FaultyFlow.failing = {"tool"}
    engine, _ = scripted_engine([KeepingFlow], [text("hello"), call(("explode", {})), text("still here")])
    first = await engine.run("KeepingFlow", "hi")
    before = await stored(engine, first.session)
    failed = await engine.run("KeepingFlow", "explode", session_id=first.session)
    assert (failed.status_code, failed.error_code) == (500, "TURN_FAILED")
    assert await stored(engine, first.session) == before

    FaultyFlow.failing = set()
    again = await engine.run("KeepingFlow", "hello?", session_id=first.session)
    assert (again.success, again.session, again.message) == (True, first.session, "still here")


async def test_an_aborted_session_that_cannot_be_saved_still_answers_the_fixed_sentence(monkeypatch):
    FaultyFlow.failing = {"tool"}
    engine, _ = scripted_engine([FaultyFlow], [text("hello"), call(("explode", {}))])
    first = await engine.run("FaultyFlow", "hi")

    async def down(doc, expected_revision):
        raise SessionStoreError("save", doc.id, f"{MARKER} http://10.0.0.7:8000 table sessions-prod")

    monkeypatch.setattr(engine.session_store, "save", down)
    failed = await engine.run("FaultyFlow", "explode", session_id=first.session)
    assert (failed.error_code, failed.message) == ("TURN_FAILED", public_message("TURN_FAILED"))


@pytest.mark.parametrize("hook", ["ctor", "init", "steps", "model"])
async def test_setup_errors_are_answered_never_raised_and_create_nothing(hook):
    FaultyFlow.failing = {hook}
    store = MemorySessionStore()
    engine, model = scripted_engine([FaultyFlow], [text("never")], store=store)
    failed = await engine.run("FaultyFlow", "hi")
    assert (failed.success, failed.status_code, failed.error_code) == (False, 500, "FLOW_SETUP_FAILED")
    assert failed.message == public_message("FLOW_SETUP_FAILED") and failed.session == ""
    assert MARKER in (failed.detail or "") and model.calls == [] and store._rows == {}


async def test_a_raising_restore_hook_leaves_the_session_for_the_fixed_flow_to_resume():
    engine, _ = scripted_engine([FaultyFlow], [text("hello"), text("resumed")])
    first = await engine.run("FaultyFlow", "hi")
    before = await stored(engine, first.session)

    FaultyFlow.failing = {"restore"}
    for _ in range(2):
        failed = await engine.run("FaultyFlow", "again", session_id=first.session)
        assert (failed.status_code, failed.error_code, failed.session) == (500, "RESTORE_FAILED", first.session)
        assert await stored(engine, first.session) == before

    FaultyFlow.failing = set()
    resumed = await engine.run("FaultyFlow", "again", session_id=first.session)
    assert (resumed.success, resumed.session, resumed.message) == (True, first.session, "resumed")


async def test_a_raising_on_start_aborts_like_any_step_defect():
    FaultyFlow.failing = {"start"}
    engine, model = scripted_engine([FaultyFlow], [text("never")])
    failed = await engine.run("FaultyFlow", "hi")
    assert failed.error_code == "TURN_FAILED" and model.calls == []
    assert (await stored(engine, failed.session))[1] == "aborted"


def test_every_code_has_one_fixed_sentence():
    assert all(sentence.endswith(".") and "{" not in sentence for sentence in PUBLIC_MESSAGES.values())
    assert public_message("SOMETHING_NEW") == "The turn failed."


# -- nothing internal reaches a client over HTTP --------------------------------------------------


class Http:
    def __init__(self, table, tmp_path, monkeypatch) -> None:
        self.table, self.tmp_path, self.monkeypatch = table, tmp_path, monkeypatch

    def script(self, *replies: dict[str, Any]) -> None:
        path = self.tmp_path / "script.json"
        path.write_text(json.dumps(list(replies)))
        self.monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        self.monkeypatch.setattr(aws_runtime, "_runtime", None)

    def post(self, path: str, body: dict[str, Any] | None = None, session: str | None = None,
             key: str | None = None) -> tuple[int, dict[str, str], str]:
        headers = {"CHAT_SESSION_ID": session} if session else {}
        if key:
            headers["Idempotency-Key"] = key
        event = http_event("POST", path, body=body, headers=headers)
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], result.get("headers", {}), result.get("body") or ""

    def run(self, message: str, session: str | None = None, flow: str = "FaultyFlow",
            key: str | None = None) -> tuple[int, dict[str, str], str]:
        return self.post("/ai/run", {"flowName": flow, "message": message}, session, key)


@pytest.fixture
def http(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Http]:
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", faulty_flows.__name__)
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "PICOFLOW_SCRIPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield Http(moto_dynamodb, tmp_path, monkeypatch)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def assert_clean(status: int, headers: dict[str, str], body: str, code: str, caplog) -> None:
    assert MARKER not in body and all(MARKER not in value for value in headers.values())
    for leak in ("hunter2", "/srv/app", "Traceback", "10.0.0.7", "sessions-prod", "dynamodb.internal"):
        assert leak not in body
    envelope = json.loads(body)
    assert (envelope["code"], envelope["success"]) == (code, False), (status, envelope)
    assert envelope["message"] == public_message(code)
    # The same id is on the log record that holds the details, so an operator can find them.
    logged = [record for record in caplog.records if getattr(record, "requestId", None) == envelope["requestId"]]
    assert logged and all(MARKER not in record.getMessage() for record in logged)


def test_no_failure_path_leaks_exception_text_to_the_client(http, monkeypatch, caplog):
    http.script(text("hello"), text("lost"), text("unknown"), call(("explode", {})), *[model_error()] * 3)
    status, headers, body = http.run("hi")
    session = json.loads(body)["session"]

    for hook, code in (("init", "FLOW_SETUP_FAILED"), ("ctor", "FLOW_SETUP_FAILED"), ("restore", "RESTORE_FAILED")):
        FaultyFlow.failing = {hook}
        status, headers, body = http.run("hi", session=session)
        assert status == 500
        assert_clean(status, headers, body, code, caplog)
    FaultyFlow.failing = set()

    store = aws_runtime.get_engine().session_store
    save = store.save

    async def down(doc, expected_revision):
        raise SessionStoreError("save", doc.id, f"{MARKER} https://dynamodb.internal/ sessions-prod", status_code=503)

    async def no_answer(doc, expected_revision):
        raise SessionStoreError(
            "save", doc.id, f"{MARKER} ReadTimeout on https://dynamodb.internal/", status_code=503, ambiguous=True
        )

    monkeypatch.setattr(store, "save", down)
    status, headers, body = http.run("hi", session=session)
    assert status == 503
    assert_clean(status, headers, body, "SESSION_STORE_ERROR", caplog)

    monkeypatch.setattr(store, "save", no_answer)
    status, headers, body = http.run("hi", session=session, key="leak-test-key-1")
    assert status == 503
    assert_clean(status, headers, body, "SESSION_OUTCOME_UNKNOWN", caplog)
    monkeypatch.setattr(store, "save", save)

    FaultyFlow.failing = {"tool"}
    status, headers, body = http.run("explode", session=session)
    assert status == 500
    assert_clean(status, headers, body, "TURN_FAILED", caplog)
    FaultyFlow.failing = set()

    status, headers, body = http.run("hi")  # the model fails every attempt
    assert status == 502 and int(headers["Retry-After"]) > 0
    assert_clean(status, headers, body, "MODEL_UNAVAILABLE", caplog)

    async def delete_down(session_id, expected_revision=None):
        raise SessionStoreError("delete", session_id, f"{MARKER} https://dynamodb.internal/ sessions-prod")

    monkeypatch.setattr(store, "delete", delete_down)
    status, headers, body = http.post("/ai/end", session=json.loads(body)["session"])
    assert status == 400 and MARKER not in body and "dynamodb.internal" not in body


def test_flow_code_that_never_returns_is_cut_off_before_the_lambda_deadline(http):
    http.script(text("hello"), call(("explode", {})))
    _, _, body = http.run("hi")
    session = json.loads(body)["session"]
    item_before = http.table.client.get_item(TableName=http.table.name, Key={"id": {"S": session}})["Item"]

    FaultyFlow.failing = {"hang"}
    event = http_event("POST", "/ai/run", body={"flowName": "FaultyFlow", "message": "explode"},
                       headers={"CHAT_SESSION_ID": session})
    started = time.monotonic()
    result = api.lambda_handler(event, FakeLambdaContext(timeout_ms=4_000))
    elapsed = time.monotonic() - started
    envelope = json.loads(result["body"])
    assert (result["statusCode"], envelope["code"]) == (504, "TURN_DEADLINE")
    assert 1.5 < elapsed < 4.0  # the handler keeps 2 s back for the answer
    assert http.table.client.get_item(TableName=http.table.name, Key={"id": {"S": session}})["Item"] == item_before


# -- a failure after this request saved the session says so -------------------------------------------


def test_a_model_outage_after_a_restore_hook_saved_the_session_does_not_claim_it_unchanged(http):
    http.script(text("hello"), *[model_error()] * 3, text("welcome back"), *[model_error()] * 3)
    status, _, body = http.run("hi", flow="MigratingFlow")
    assert status == 200
    session = json.loads(body)["session"]
    store = aws_runtime.get_runtime().engine.session_store

    def load() -> Any:
        return aws_runtime.get_runtime().call(store.load(session))

    first = load()
    assert first.revision == 1 and "schema" not in first.flow.context

    # The restore hook migrates the document, which is saved before the turn goes on; then the model fails.
    status, headers, body = http.run("book a room", session=session, flow="MigratingFlow")
    answer = json.loads(body)
    assert (status, answer["code"]) == (502, "MODEL_UNAVAILABLE") and int(headers["Retry-After"]) > 0
    assert answer["message"] == public_message("MODEL_UNAVAILABLE", saved=True)
    assert "unchanged" not in answer["message"] and MARKER not in body
    migrated = load()
    assert migrated.revision == 2 and migrated.flow.context["schema"] == 2 and migrated.run_status == "running"
    assert [m.content for m in migrated.flow.memory["chat"].messages][-1] == "hello"  # the turn itself left no trace

    # The next turn continues the migrated session (nothing left to migrate) and answers.
    status, _, body = http.run("book a room", session=session, flow="MigratingFlow")
    assert status == 200 and json.loads(body)["message"] == "welcome back"
    assert load().revision == 3

    # A failure in a request that saved nothing keeps the usual sentence.
    status, _, body = http.run("and breakfast?", session=session, flow="MigratingFlow")
    answer = json.loads(body)
    assert (status, answer["message"]) == (502, public_message("MODEL_UNAVAILABLE"))
    assert "unchanged" in answer["message"] and load().revision == 3


def test_every_retryable_sentence_that_promises_an_unchanged_session_has_a_saved_variant():
    promising = [code for code in RETRY_AFTER_SECONDS if "unchanged" in PUBLIC_MESSAGES[code]]
    assert promising
    for code in promising:
        assert "unchanged" not in public_message(code, saved=True)
        assert public_message(code, saved=True) != public_message(code)
    for code in RETRY_AFTER_SECONDS:
        if code not in promising:
            assert public_message(code, saved=True) == public_message(code)
