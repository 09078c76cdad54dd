"""Retry safety of keyed turns: every failure timing of an ``Idempotency-Key`` turn, across separate processes.

A client that retries a turn with the same ``Idempotency-Key`` must see the turn applied exactly once,
whatever happened to its first attempt: the save timed out but landed, the serving process died after
(or before) its save reached the table, two processes ran the same turn at once, or DynamoDB froze.
The receipt of a keyed turn travels inside the session item, in the same conditional ``PutItem`` as the
turn, so after each scenario these tests read the item straight from DynamoDB Local and check that the
human message and the AI reply each appear once, at the expected revision, with one receipt for the key.

Why separate processes: the guarantees must hold without anything the serving process keeps in memory
(its session locks, its caches, its model script), as in production, where a retry can reach another
Lambda container, or a fresh one after a crash. So each server here is a real ``picoflow serve``
subprocess (the Lambda handler behind a local API Gateway), killed with SIGKILL where the scenario is a
crash, and only DynamoDB (Local) is shared. Faults are injected by ``FaultyDynamoDB``, a proxy running in
the test process between the servers and DynamoDB Local; its ``held`` event tells the test exactly when a
request is stuck, so no scenario synchronises by sleeping.

Every server's model is scripted; replies a server must never reach say ``SECOND MODEL CALL``, so a
model call that should not have happened shows up in a response or in the stored item.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from picoflow.errors import public_message
from picoflow.session.receipts import first_turn_session_id, key_digest
from tests.support.dynamodb_local import DUMMY_AWS_ENV, DynamoTable, create_unique_table, local_client
from tests.support.faulty_dynamodb import FaultyDynamoDB
from tests.support.tiny_flow import NAMESPACE

REPO_ROOT = Path(__file__).resolve().parents[1]
FLOW = "TinyFlow"
#: The content of every scripted reply that a correct engine never asks for.
SECOND_CALL = "SECOND MODEL CALL"
#: Seconds allowed for a server process to import, bind and answer ``/health``.
START_TIMEOUT_SECONDS = 30
#: Bounds every HTTP request of the tests, so a hung server fails the test instead of hanging it.
HTTP_TIMEOUT_SECONDS = 30
#: Bounds every wait on the proxy's ``held`` event.
HOLD_TIMEOUT_SECONDS = 20
#: The Lambda timeout of the frozen-store scenario; the handler keeps 2 s of it back as margin.
FROZEN_LAMBDA_TIMEOUT_SECONDS = 8
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")
_FAILURE_KEYS = {"success", "completed", "message", "session", "code", "requestId"}
#: What a session's first turn puts before the user's message: the step's opener (``Step`` enters with "Start").
OPENER = [("human", "Start")]

Response = tuple[int, dict[str, str], Any]


# -- the serving processes ---------------------------------------------------------------------------


class Server:
    """One ``picoflow serve`` process: a fresh Lambda container on its own port, with its own model script."""

    def __init__(self, name: str, table: DynamoTable, endpoint_url: str, workdir: Path) -> None:
        self.name = name
        self.table = table
        self.endpoint_url = endpoint_url
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, env_overrides: dict[str, str] | None = None, script: list[dict[str, Any]] | None = None) -> Server:
        """Start the process on a free port and wait until it serves turns (engine built, store client ready)."""
        script_path = self.workdir / f"{self.name}-script.json"
        script_path.write_text(json.dumps(script if script is not None else [{"content": SECOND_CALL}]))
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("AWS_", "OPENAI_", "PICOFLOW_", "POWERTOOLS_", "SESSION_", "DYNAMODB_"))
        }
        env.update(DUMMY_AWS_ENV)
        env.update(
            {
                "PYTHONPATH": str(REPO_ROOT),
                "SESSION_STORE": "DYNAMODB",
                "SESSION_TABLE": self.table.name,
                "DYNAMODB_ENDPOINT_URL": self.endpoint_url,
                "PICOFLOW_FLOWS": "tests.support.tiny_flow",
                "PICOFLOW_SCRIPT": str(script_path),
                "POWERTOOLS_METRICS_DISABLED": "true",
                **(env_overrides or {}),
            }
        )
        with open(self.log_path, "wb") as log:
            # --port 0: the process binds a free port itself and prints it, so no other process can take it first.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "picoflow.local.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_until_up()
        # The engine and its DynamoDB client are built on the first turn-like request: do it now (a delete of
        # an unknown id is one GetItem and writes nothing), so the scenarios time turns, not imports.
        status, _, body = self.request("POST", "/ai/end", headers={"CHAT_SESSION_ID": f"warm-up-{uuid.uuid4().hex}"})
        assert status == 404 and body["code"] == "SESSION_NOT_FOUND", f"{self.name} warm-up: {body}\n{self.log_tail()}"
        return self

    def _wait_until_up(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"server {self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if not self.port:
                match = _LISTENING.search(self.log_path.read_text(errors="replace"))
                if match:
                    self.port = int(match.group(2))
            if self.port:
                try:
                    status, _, body = self.request("GET", "/health", timeout=2)
                    if status == 200 and body == {"status": "ok"}:
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        pytest.fail(f"server {self.name} did not answer /health within {START_TIMEOUT_SECONDS} s:\n{self.log_tail()}")

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        *,
        timeout: float = HTTP_TIMEOUT_SECONDS,
    ) -> Response:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = json.dumps(body).encode("utf-8") if body is not None else None
            sent = {"Content-Type": "application/json", **(headers or {})} if payload is not None else headers or {}
            connection.request(method, path, body=payload, headers=sent)
            response = connection.getresponse()
            raw = response.read()
            response_headers = {name.lower(): value for name, value in response.getheaders()}
        finally:
            connection.close()
        parsed = json.loads(raw) if response_headers.get("content-type") == "application/json" else raw
        return response.status, response_headers, parsed

    def run(self, message: str, key: str | None = None, session: str | None = None) -> Response:
        """``POST /ai/run`` for the tiny flow: (status, lower-cased headers, JSON body)."""
        headers = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        if session is not None:
            headers["CHAT_SESSION_ID"] = session
        return self.request("POST", "/ai/run", {"flowName": FLOW, "message": message}, headers)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, mid-request, like a crashed or recycled Lambda container."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


StartServer = Callable[..., Server]


@pytest.fixture
def table(dynamodb_local: str) -> Iterator[DynamoTable]:
    """A fresh sessions table on DynamoDB Local, dropped afterwards."""
    client = local_client(dynamodb_local)
    created = create_unique_table(client, dynamodb_local, prefix="retry")
    yield created
    client.delete_table(TableName=created.name)
    client.close()


@pytest.fixture
def proxy(dynamodb_local: str) -> Iterator[FaultyDynamoDB]:
    """A fault-injecting proxy in front of DynamoDB Local; requests pass through unless a plan says otherwise."""
    with FaultyDynamoDB(upstream=dynamodb_local) as fake:
        yield fake


@pytest.fixture
def start_server(table: DynamoTable, tmp_path: Path) -> Iterator[StartServer]:
    """Start ``picoflow serve`` processes on ``table`` (through ``endpoint_url`` when given); all killed afterwards."""
    started: list[Server] = []

    def start(
        name: str,
        script: list[dict[str, Any]],
        *,
        endpoint_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Server:
        server = Server(name, table, endpoint_url or str(table.endpoint_url), tmp_path)
        started.append(server)
        return server.start(env, script)

    yield start
    for server in started:
        server.kill()


# -- reading the table -------------------------------------------------------------------------------


def read_item(table: DynamoTable, session: str) -> dict[str, Any] | None:
    response = table.client.get_item(TableName=table.name, Key={"id": {"S": session}}, ConsistentRead=True)
    return response.get("Item")


def raw_doc(item: dict[str, Any]) -> str:
    return zlib.decompress(item["doc"]["B"]).decode("utf-8")


def chat(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The conversation in the tiny flow's namespace, without the system slot."""
    # A session whose first turn never landed has no namespace yet.
    messages = doc["flow"]["memory"].get(NAMESPACE, {}).get("messages", [])
    return [(m["type"], m["content"]) for m in messages if m["type"] in ("human", "ai")]


def item_count(table: DynamoTable) -> int:
    return table.client.scan(TableName=table.name, Select="COUNT", ConsistentRead=True)["Count"]


def assert_turn_once(
    table: DynamoTable,
    session: str,
    *,
    key: str,
    message: str,
    reply: str,
    revision: int,
    before: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The stored session holds the keyed turn exactly once, at ``revision``, with one receipt for ``key``."""
    item = read_item(table, session)
    assert item is not None, f"session {session} is not stored"
    raw = raw_doc(item)
    doc = json.loads(raw)
    assert int(item["revision"]["N"]) == doc["revision"] == revision, raw
    conversation = chat(doc)
    assert conversation == [*(before or []), ("human", message), ("ai", reply)], conversation
    assert conversation.count(("human", message)) == 1 and conversation.count(("ai", reply)) == 1
    assert doc["runStatus"] == "running" and doc["error"] == []
    receipts = [r for r in doc["_item"]["receipts"] if r["key"] == key_digest(key)]
    assert len(receipts) == 1, doc["_item"]["receipts"]
    assert receipts[0]["response"]["message"] == reply
    assert SECOND_CALL not in raw, "a model call that must not happen reached the stored session"
    return doc


def assert_failure_envelope(response: Response, statuses: set[int], codes: set[str]) -> None:
    status, headers, body = response
    assert status in statuses and body["code"] in codes, response
    assert set(body) == _FAILURE_KEYS, body
    assert body["success"] is False and body["completed"] is False
    assert body["message"] == public_message(body["code"])
    assert int(headers["retry-after"]) > 0, headers


def run_in_background(server: Server, message: str, key: str) -> tuple[threading.Thread, dict[str, Any]]:
    """Send a keyed first turn from a thread; the outcome (a response or the client's error) lands in a dict."""
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["response"] = server.run(message, key=key)
        except Exception as exc:  # noqa: BLE001 - the point is to see what the client got
            outcome["error"] = exc

    thread = threading.Thread(target=send, name=f"client-of-{server.name}", daemon=True)
    thread.start()
    return thread, outcome


def unique(text: str) -> str:
    return f"{text} {uuid.uuid4().hex[:8]}"


# -- scenarios -------------------------------------------------------------------------------------------


def test_save_that_timed_out_but_landed_is_resolved_then_replayed(
    table: DynamoTable, proxy: FaultyDynamoDB, start_server: StartServer
) -> None:
    server = start_server("a", [{"content": "first reply"}, {"content": SECOND_CALL}], endpoint_url=proxy.endpoint_url)
    key, message = f"key-{uuid.uuid4().hex}", unique("hello")
    session = first_turn_session_id(key)
    before = proxy.counts()
    # The turn's one write (it creates the session) lands, but its answer comes after the client's 5 s read timeout.
    proxy.plan = {"PutItem": ["late"]}

    started = time.monotonic()
    first = server.run(message, key=key)
    elapsed = time.monotonic() - started

    status, headers, body = first
    assert status != 503 or body.get("code") != "SESSION_OUTCOME_UNKNOWN", (
        f"the save landed: the engine must learn it by reading back, not answer 'outcome unknown': {first}"
    )
    assert status == 200, f"{first}\n{server.log_tail()}"
    assert (body["success"], body["message"], body["session"]) == (True, "first reply", session)
    assert headers["chat_session_id"] == session and "idempotent-replayed" not in headers
    counts = proxy.counts()
    # The late write (+ botocore's retry of it, which meets its own condition), then a read-back.
    assert counts["PutItem"] - before.get("PutItem", 0) >= 1
    assert counts["GetItem"] - before.get("GetItem", 0) >= 1, "the outcome must be settled by reading back"

    retry = server.run(message, key=key)

    assert retry[0] == 200 and retry[2] == body, retry
    assert retry[1]["idempotent-replayed"] == "true" and retry[1]["chat_session_id"] == session
    assert SECOND_CALL not in json.dumps(retry[2])
    assert_turn_once(table, session, key=key, message=message, reply="first reply", revision=1, before=OPENER)
    print(f"\nlate save: 200 after {elapsed:.2f} s (resolved by read-back), retry replayed; requests {counts}")


def test_process_killed_after_its_save_landed_is_replayed_by_a_fresh_process(
    table: DynamoTable, proxy: FaultyDynamoDB, start_server: StartServer
) -> None:
    first_server = start_server("a", [{"content": "reply of the killed process"}], endpoint_url=proxy.endpoint_url)
    key, message = f"key-{uuid.uuid4().hex}", unique("hello")
    session = first_turn_session_id(key)
    # The turn's one write reaches the table; its answer never reaches the process.
    proxy.plan = {"PutItem": ["land_hold"]}

    thread, outcome = run_in_background(first_server, message, key)
    assert proxy.held.wait(HOLD_TIMEOUT_SECONDS), f"the save never reached the proxy\n{first_server.log_tail()}"
    first_server.kill()
    thread.join(HTTP_TIMEOUT_SECONDS)
    proxy.release.set()
    assert not thread.is_alive() and "error" in outcome, f"the client must get no answer: {outcome}"
    assert int(read_item(table, session)["revision"]["N"]) == 1, "the held save had landed"

    fresh = start_server("b", [{"content": SECOND_CALL}])
    status, headers, body = fresh.run(message, key=key)

    assert status == 200, f"{body}\n{fresh.log_tail()}"
    assert headers["idempotent-replayed"] == "true" and headers["chat_session_id"] == session
    assert (body["success"], body["message"], body["session"]) == (True, "reply of the killed process", session)
    assert SECOND_CALL not in json.dumps(body)
    assert_turn_once(
        table, session, key=key, message=message, reply="reply of the killed process", revision=1, before=OPENER
    )
    print(f"\nkilled after the save landed: client got {type(outcome['error']).__name__}; fresh process replayed")


def test_process_killed_before_its_save_landed_runs_the_turn_once_on_retry(
    table: DynamoTable, proxy: FaultyDynamoDB, start_server: StartServer
) -> None:
    first_server = start_server("a", [{"content": "reply that was never saved"}], endpoint_url=proxy.endpoint_url)
    key, message = f"key-{uuid.uuid4().hex}", unique("hello")
    session = first_turn_session_id(key)
    # The turn's one write never reaches the table.
    proxy.plan = {"PutItem": ["hold"]}

    thread, outcome = run_in_background(first_server, message, key)
    assert proxy.held.wait(HOLD_TIMEOUT_SECONDS), f"the save never reached the proxy\n{first_server.log_tail()}"
    first_server.kill()
    proxy.release.set()
    thread.join(HTTP_TIMEOUT_SECONDS)
    assert not thread.is_alive() and "error" in outcome, f"the client must get no answer: {outcome}"
    # What the crash left behind: nothing, as a new session is written only by its first turn's write.
    assert read_item(table, session) is None

    fresh = start_server("b", [{"content": "reply of the retry"}, {"content": SECOND_CALL}])
    status, headers, body = fresh.run(message, key=key)

    assert status == 200, f"{body}\n{fresh.log_tail()}"
    assert "idempotent-replayed" not in headers, "nothing had been applied, so nothing can be replayed"
    assert (body["success"], body["message"], body["session"]) == (True, "reply of the retry", session)
    assert headers["chat_session_id"] == session
    doc = assert_turn_once(
        table, session, key=key, message=message, reply="reply of the retry", revision=1, before=OPENER
    )
    assert "reply that was never saved" not in json.dumps(doc)
    assert item_count(table) == 1, "the retry must continue the orphaned session, not start another"
    print("\nkilled before the save: orphan at revision 0, retry ran the first turn there once (revision 1)")


def test_same_keyed_turn_sent_to_two_processes_at_once_is_applied_once(
    table: DynamoTable, start_server: StartServer
) -> None:
    # Both model calls take 1 s, so both turns read the same revision and overlap before either saves.
    server_a = start_server("a", [{"content": "opening ack"}, {"content": "reply from A", "delay": 1.0}])
    server_b = start_server("b", [{"content": "reply from B", "delay": 1.0}])
    opening = unique("opening")
    status, _, opened = server_a.run(opening)
    assert status == 200, opened
    session = opened["session"]
    history = [*OPENER, ("human", opening), ("ai", "opening ack")]

    key, message = f"key-{uuid.uuid4().hex}", unique("duplicate")
    barrier = threading.Barrier(2, timeout=HTTP_TIMEOUT_SECONDS)
    results: dict[str, Response] = {}
    errors: list[BaseException] = []

    def send(server: Server) -> None:
        try:
            barrier.wait()
            results[server.name] = server.run(message, key=key, session=session)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(server,)) for server in (server_a, server_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HTTP_TIMEOUT_SECONDS + 5)
    assert not errors and len(results) == 2, (errors, results)

    (status_a, headers_a, body_a), (status_b, headers_b, body_b) = results["a"], results["b"]
    assert (status_a, status_b) == (200, 200), (results, server_a.log_tail(), server_b.log_tail())
    # The replies differ per process, so equal bodies mean the loser answered with the winner's response.
    assert body_a == body_b, results
    assert body_a["session"] == session and body_a["message"] in ("reply from A", "reply from B")
    replayed = sorted(headers.get("idempotent-replayed") == "true" for headers in (headers_a, headers_b))
    assert replayed == [False, True], "exactly one process applies the turn; the other replays it"
    winner = body_a["message"]
    loser = "reply from B" if winner == "reply from A" else "reply from A"
    doc = assert_turn_once(table, session, key=key, message=message, reply=winner, revision=2, before=history)
    assert loser not in json.dumps(doc)
    print(f"\nconcurrent duplicates: both 200 with '{winner}', replayed flags {replayed}, revision 2")


def test_frozen_store_answers_before_the_lambda_deadline_and_the_retry_applies_once(
    table: DynamoTable, proxy: FaultyDynamoDB, start_server: StartServer
) -> None:
    server = start_server(
        "a",
        [{"content": "opening ack"}, {"content": "reply after the thaw"}, {"content": SECOND_CALL}],
        endpoint_url=proxy.endpoint_url,
        env={"AWS_LAMBDA_FUNCTION_TIMEOUT": str(FROZEN_LAMBDA_TIMEOUT_SECONDS)},
    )
    opening = unique("opening")
    status, _, opened = server.run(opening)
    assert status == 200, opened
    session = opened["session"]
    history = [*OPENER, ("human", opening), ("ai", "opening ack")]
    frozen_item = read_item(table, session)
    # DynamoDB freezes: every read and write hangs, far longer than the Lambda may run.
    proxy.plan = {"GetItem": ["hold"] * 50, "PutItem": ["hold"] * 50}

    key, message = f"key-{uuid.uuid4().hex}", unique("during the freeze")
    started = time.monotonic()
    frozen = server.run(message, key=key, session=session)
    elapsed = time.monotonic() - started

    assert proxy.held.is_set()
    assert elapsed < FROZEN_LAMBDA_TIMEOUT_SECONDS, f"answered after {elapsed:.2f} s, past the Lambda's timeout"
    assert_failure_envelope(frozen, {503, 504}, {"SESSION_STORE_ERROR", "TURN_DEADLINE", "SESSION_OUTCOME_UNKNOWN"})
    assert frozen[2]["session"] == session and frozen[1]["chat_session_id"] == session
    assert read_item(table, session) == frozen_item, "a turn that failed on a frozen store must not change it"

    # The store thaws: nothing is held any more, everything passes.
    proxy.plan = {}
    proxy.release.set()
    retry = server.run(message, key=key, session=session)

    status, headers, body = retry
    assert status == 200, f"{retry}\n{server.log_tail()}"
    assert (body["success"], body["message"], body["session"]) == (True, "reply after the thaw", session)
    assert "idempotent-replayed" not in headers
    assert_turn_once(
        table, session, key=key, message=message, reply="reply after the thaw", revision=2, before=history
    )
    print(f"\nfrozen store: {frozen[0]} {frozen[2]['code']} after {elapsed:.2f} s of an "
          f"{FROZEN_LAMBDA_TIMEOUT_SECONDS} s Lambda; retry after the thaw 200 at revision 2")


def test_same_key_with_another_body_on_another_process_is_refused_and_writes_nothing(
    table: DynamoTable, start_server: StartServer
) -> None:
    server_a = start_server("a", [{"content": "reply from A"}])
    key, message = f"key-{uuid.uuid4().hex}", unique("hello")
    session = first_turn_session_id(key)
    status, _, body = server_a.run(message, key=key)
    assert (status, body["message"], body["session"]) == (200, "reply from A", session), body
    applied = read_item(table, session)

    server_b = start_server("b", [{"content": SECOND_CALL}])
    # The same key with another message, once as a retried first turn and once on the session it created.
    refusals = [server_b.run(unique("something else"), key=key), server_b.run("other", key=key, session=session)]

    for status, headers, refused in refusals:
        assert status == 422, (status, refused, server_b.log_tail())
        assert refused["code"] == "IDEMPOTENCY_KEY_MISMATCH" and set(refused) == _FAILURE_KEYS, refused
        assert refused["message"] == public_message("IDEMPOTENCY_KEY_MISMATCH")
        assert refused["success"] is False and "idempotent-replayed" not in headers
        assert SECOND_CALL not in json.dumps(refused)
    assert read_item(table, session) == applied, "a refused key must leave the session exactly as it was"
    assert item_count(table) == 1
    assert_turn_once(table, session, key=key, message=message, reply="reply from A", revision=1, before=OPENER)
    print("\nsame key, other body on another process: 422 IDEMPOTENCY_KEY_MISMATCH twice, revision 1 unchanged")
