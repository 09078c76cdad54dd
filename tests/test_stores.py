"""Session stores: the shared conformance suite on every backend, then backend-specific behaviour."""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import os
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from picoflow.errors import (
    PicoFlowError,
    SessionConflictError,
    SessionFlowInvariantError,
    SessionStoreError,
    SessionTooLargeError,
)
from picoflow.session.conformance import CHECK_NAMES, run_check, run_conformance
from picoflow.session.document import SessionDoc, format_timestamp
from picoflow.session.dynamodb_store import MAX_ITEM_BYTES, DynamoDBSessionStore, item_size
from picoflow.session.factory import store_from_env
from picoflow.session.memory_store import MemorySessionStore
from picoflow.session.sqlite_store import SQLiteSessionStore
from picoflow.session.store import SessionStore
from tests.support.dynamodb_local import REGION, DynamoTable, free_port

BACKENDS = ["memory", "sqlite", "moto", "dynamodb-local"]
MEMORY_LIMIT = 2 * 1024 * 1024

FLOW = {
    "name": "HotelFlow",
    "context": {"config": {"tenantId": "demo"}},
    "memory": {"ExploreStep": {"messages": [{"type": "human", "content": "Find me a room in Lisbon"}]}},
    "steps": [{"name": "ExploreStep", "state": {"city": "Lisbon"}}],
    "currentStep": "ExploreStep",
}


@pytest.fixture(params=BACKENDS)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], SessionStore]:
    """A factory of fresh stores on one backend; the backend name shows in every test id."""
    backend = request.param
    if backend == "memory":
        return lambda: MemorySessionStore(max_document_bytes=MEMORY_LIMIT)
    if backend == "sqlite":
        path = tmp_path / "not" / "yet" / "there" / "sessions.sqlite"
        return lambda: SQLiteSessionStore(path)
    if backend == "moto":
        moto_table: DynamoTable = request.getfixturevalue("moto_dynamodb")
        session = _one_request_at_a_time(boto3.session.Session())
        return lambda: moto_table.store(session=session)
    table: DynamoTable = request.getfixturevalue("dynamodb_local_table")
    return table.store


def _one_request_at_a_time(session: boto3.session.Session) -> boto3.session.Session:
    """``session``, whose DynamoDB clients now send one request at a time.

    moto is not built for requests from several threads at once (its FAQ): two threads' conditional writes can
    both pass its check. Under moto the conformance checks' concurrent writers therefore take turns, which still
    asks that exactly one of them wins; DynamoDB Local runs the same checks with real concurrency.
    """
    lock = threading.Lock()

    def hold(**_: Any) -> None:
        lock.acquire()

    def release(**_: Any) -> None:
        lock.release()

    session.events.register("before-call.dynamodb", hold)
    session.events.register("after-call.dynamodb", release)
    session.events.register("after-call-error.dynamodb", release)
    return session


@pytest.fixture(params=["moto", "dynamodb-local"])
def dynamo(request: pytest.FixtureRequest) -> DynamoTable:
    return request.getfixturevalue("moto_dynamodb" if request.param == "moto" else "dynamodb_local_table")


# --- the conformance suite, one test per check per backend ---------------------------------------


@pytest.mark.parametrize("check", CHECK_NAMES)
async def test_conformance(make_store: Callable[[], SessionStore], check: str) -> None:
    assert await run_check(check, make_store, large_history=True) == check


async def test_run_conformance_reports_skips_for_an_unbounded_store() -> None:
    outcomes = await run_conformance(MemorySessionStore)
    assert outcomes[: len(CHECK_NAMES) - 2] == list(CHECK_NAMES[:-2])
    assert outcomes[-2].startswith("size_limit (skipped: store is unbounded")
    assert outcomes[-1] == "large_history (skipped: large_history=False)"


async def test_run_conformance_accepts_an_async_factory(tmp_path: Path) -> None:
    async def factory() -> SessionStore:
        return SQLiteSessionStore(tmp_path / "s.sqlite", max_document_bytes=256 * 1024)

    assert await run_conformance(factory) == [*CHECK_NAMES[:-1], "large_history (skipped: large_history=False)"]


async def test_conformance_failure_names_the_check() -> None:
    class ForgetfulStore(MemorySessionStore):
        async def load(self, session_id: str) -> SessionDoc | None:
            return None

    with pytest.raises(AssertionError, match="create_and_load: load"):
        await run_check("create_and_load", ForgetfulStore)


async def test_ids_are_32_hex_characters_and_unique(make_store: Callable[[], SessionStore]) -> None:
    store = make_store()
    ids = [(await store.create(FLOW)).id for _ in range(25)]
    await store.close()
    assert all(re.fullmatch(r"[0-9a-f]{32}", session_id) for session_id in ids)
    assert len(set(ids)) == len(ids)


async def test_create_refuses_an_oversized_flow_without_writing(make_store: Callable[[], SessionStore]) -> None:
    store = make_store()
    limit = store.max_document_bytes
    assert limit is not None
    flow = {**FLOW, "context": {"blob": base64.b64encode(os.urandom(limit * 3 // 2)).decode("ascii")}}
    with pytest.raises(SessionTooLargeError) as raised:
        await store.create(flow)
    assert raised.value.status_code == 413
    assert await store.load(raised.value.session_id) is None
    await store.close()


# --- memory ------------------------------------------------------------------------------------


async def test_memory_store_never_shares_objects_with_callers() -> None:
    store = MemorySessionStore()
    doc = await store.create(FLOW)
    doc.flow.context["note"] = "kept"
    saved = await store.save(doc, 0)
    doc.flow.context["note"] = "changed after save"
    saved.flow.context["note"] = "changed on the returned copy"
    loaded = await store.load(doc.id)
    assert loaded is not None and loaded.flow.context["note"] == "kept"
    loaded.flow.steps[0].state["city"] = "Porto"
    again = await store.load(doc.id)
    assert again is not None and again.flow.steps[0].state["city"] == "Lisbon"
    assert again is not loaded


async def test_memory_store_is_unbounded_unless_told() -> None:
    assert MemorySessionStore().max_document_bytes is None
    assert MemorySessionStore(max_document_bytes=10).max_document_bytes == 10


# --- SQLite ------------------------------------------------------------------------------------


async def test_sqlite_schema_wal_and_parent_folders(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "sessions.sqlite"
    store = SQLiteSessionStore(path)
    doc = await store.create(FLOW)
    saved = await store.save(doc, 0)
    await store.close()
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(session)")]
        assert columns == ["id", "flow_name", "revision", "run_status", "save_on", "doc", "owner"]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = conn.execute("SELECT flow_name, revision, run_status, save_on, doc FROM session").fetchone()
    assert row[:4] == ("HotelFlow", 1, "running", format_timestamp(saved.save_on))
    assert json.loads(row[4])["flow"]["name"] == "HotelFlow"


async def test_sqlite_documents_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    first = SQLiteSessionStore(path)
    doc = await first.create(FLOW)
    await first.save(doc, 0)
    await first.close()
    second = SQLiteSessionStore(path)
    loaded = await second.load(doc.id)
    await second.close()
    assert loaded is not None and loaded.revision == 1


async def test_sqlite_malformed_row_is_an_invariant_error(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    store = SQLiteSessionStore(path)
    doc = await store.create(FLOW)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE session SET doc = ? WHERE id = ?", ("{not json", doc.id))
    with pytest.raises(SessionFlowInvariantError):
        await store.load(doc.id)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE session SET doc = ? WHERE id = ?", (json.dumps({"id": doc.id, "flows": []}), doc.id))
    with pytest.raises(SessionFlowInvariantError):
        await store.load(doc.id)
    await store.close()


async def test_sqlite_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    store = SQLiteSessionStore(blocker / "sessions.sqlite")
    with pytest.raises(SessionStoreError) as raised:
        await store.load("some-id")
    assert raised.value.operation == "load" and raised.value.status_code == 500


def _sqlite_race_worker(path: str, session_ids: list[str], barrier: Any, results: Any) -> None:
    async def race() -> list[str]:
        store = SQLiteSessionStore(path)
        outcomes = []
        for session_id in session_ids:
            doc = await store.load(session_id)
            assert doc is not None
            doc.flow.context["writer"] = os.getpid()
            barrier.wait(timeout=30)
            try:
                await store.save(doc, 0)
                outcomes.append("won")
            except SessionConflictError:
                outcomes.append("lost")
        await store.close()
        return outcomes

    results.put(asyncio.run(race()))


async def test_sqlite_is_safe_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    store = SQLiteSessionStore(path)
    session_ids = [(await store.create(FLOW)).id for _ in range(10)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    workers = [
        context.Process(target=_sqlite_race_worker, args=(path, session_ids, barrier, results)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=120) for _ in workers]
    except Empty:
        pytest.fail("a racing process did not report back")
    finally:
        for worker in workers:
            worker.join(timeout=30)
    for index, session_id in enumerate(session_ids):
        assert sorted(o[index] for o in outcomes) == ["lost", "won"], f"session {index}: {outcomes}"
        stored = await store.load(session_id)
        assert stored is not None and stored.revision == 1
    await store.close()


# --- DynamoDB ----------------------------------------------------------------------------------


async def test_dynamodb_item_attributes(dynamo: DynamoTable) -> None:
    store = dynamo.store(ttl_seconds=3600)
    doc = await store.create(FLOW)
    before = int(time.time())
    saved = await store.save(doc, 0)
    item = dynamo.client.get_item(TableName=dynamo.name, Key={"id": {"S": doc.id}}, ConsistentRead=True)["Item"]
    assert set(item) == {"id", "revision", "flowName", "runStatus", "saveOn", "expiresAt", "doc"}
    assert item["revision"] == {"N": "1"}
    assert item["flowName"] == {"S": "HotelFlow"}
    assert item["runStatus"] == {"S": "running"}
    assert item["saveOn"] == {"S": format_timestamp(saved.save_on)}
    assert before + 3600 <= int(item["expiresAt"]["N"]) <= int(time.time()) + 3600
    compressed = item["doc"]["B"]
    raw = zlib.decompress(compressed)
    assert json.loads(raw) == saved.to_json_dict()
    assert len(compressed) < len(raw)
    assert store.stored_size(saved) == item_size(item)
    assert store.max_document_bytes == MAX_ITEM_BYTES == 400 * 1024
    await store.close()


async def test_dynamodb_without_ttl_writes_no_expiry(dynamo: DynamoTable) -> None:
    store = dynamo.store()
    doc = await store.create(FLOW)
    item = dynamo.client.get_item(TableName=dynamo.name, Key={"id": {"S": doc.id}})["Item"]
    assert "expiresAt" not in item
    assert item["revision"] == {"N": "0"}
    await store.close()


async def test_dynamodb_honours_a_lower_limit(moto_dynamodb: DynamoTable) -> None:
    def small_store() -> DynamoDBSessionStore:
        store = moto_dynamodb.store()
        store.max_document_bytes = 8 * 1024
        return store

    assert await run_check("size_limit", small_store) == "size_limit"


async def test_dynamodb_malformed_item_is_an_invariant_error(dynamo: DynamoTable) -> None:
    store = dynamo.store()
    for doc_bytes in (b"not zlib at all", zlib.compress(b'{"id": "x", "flows": []}')):
        dynamo.client.put_item(
            TableName=dynamo.name, Item={"id": {"S": "broken"}, "revision": {"N": "3"}, "doc": {"B": doc_bytes}}
        )
        with pytest.raises(SessionFlowInvariantError):
            await store.load("broken")
    dynamo.client.put_item(TableName=dynamo.name, Item={"id": {"S": "broken"}, "revision": {"N": "3"}})
    with pytest.raises(SessionFlowInvariantError):
        await store.load("broken")
    await store.close()


async def test_dynamodb_missing_table_is_a_store_error(dynamo: DynamoTable) -> None:
    store = DynamoDBSessionStore("no-such-table", endpoint_url=dynamo.endpoint_url, region_name=REGION)
    with pytest.raises(SessionStoreError) as raised:
        await store.load("abc")
    assert raised.value.operation == "load" and raised.value.session_id == "abc"
    assert raised.value.status_code == 500 and raised.value.code == "SESSION_STORE_ERROR"
    assert "ResourceNotFoundException" in str(raised.value)
    with pytest.raises(SessionStoreError):
        await store.create(FLOW)
    await store.close()


async def test_dynamodb_unreachable_endpoint_is_unavailable(aws_credentials: None) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    client = boto3.session.Session().client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(connect_timeout=0.2, read_timeout=0.2, retries={"mode": "standard", "max_attempts": 1}),
    )
    store = DynamoDBSessionStore("sessions", client=client)
    doc = SessionDoc.model_validate({"id": "abc", "flow": FLOW})
    for operation, call in (
        ("load", lambda: store.load("abc")),
        ("create", lambda: store.create(FLOW)),
        ("save", lambda: store.save(doc, 0)),
        ("delete", lambda: store.delete("abc", 0)),
    ):
        with pytest.raises(SessionStoreError) as raised:
            await call()
        assert raised.value.operation == operation
        assert raised.value.status_code == 503
        assert isinstance(raised.value.__cause__, Exception)
    await store.close()
    client.close()


@pytest.mark.parametrize(
    ("error_code", "http_status", "expected_status"),
    [
        ("ProvisionedThroughputExceededException", 400, 503),
        ("ThrottlingException", 400, 503),
        ("RequestLimitExceeded", 400, 503),
        ("ServiceUnavailable", 503, 503),
        ("InternalServerError", 500, 500),
        ("AccessDeniedException", 400, 500),
    ],
)
async def test_dynamodb_client_errors_map_to_store_errors(
    aws_credentials: None, error_code: str, http_status: int, expected_status: int
) -> None:
    client = boto3.session.Session().client("dynamodb", region_name=REGION)
    store = DynamoDBSessionStore("sessions", client=client)
    with Stubber(client) as stub:
        stub.add_client_error("put_item", service_error_code=error_code, http_status_code=http_status)
        with pytest.raises(SessionStoreError) as raised:
            await store.create(FLOW)
    assert raised.value.status_code == expected_status
    assert raised.value.operation == "create"
    assert error_code in raised.value.message


async def test_dynamodb_item_size_rejection_from_the_service_is_too_large(aws_credentials: None) -> None:
    client = boto3.session.Session().client("dynamodb", region_name=REGION)
    store = DynamoDBSessionStore("sessions", client=client)
    with Stubber(client) as stub:
        stub.add_client_error(
            "put_item",
            service_error_code="ValidationException",
            service_message="Item size has exceeded the maximum allowed size",
        )
        with pytest.raises(SessionTooLargeError):
            await store.create(FLOW)


def test_item_size_follows_dynamodb_rules() -> None:
    assert item_size({"id": {"S": "abc"}}) == 5
    assert item_size({"doc": {"B": b"\x00" * 10}}) == 13
    assert item_size({"revision": {"N": "1"}}) == len("revision") + 2
    assert item_size({"n": {"N": "1000"}}) == 1 + 2
    assert item_size({"n": {"N": "123456"}}) == 1 + 4
    assert item_size({"s": {"S": "é"}}) == 3


def _contend(
    store: DynamoDBSessionStore, base: SessionDoc, n: int, barrier: threading.Barrier, outcomes: list[str]
) -> None:
    mine = base.model_copy(deep=True)
    mine.flow.context["writer"] = n
    barrier.wait(timeout=30)
    try:
        asyncio.run(store.save(mine, base.revision))
        outcomes.append(f"won:{n}")
    except SessionConflictError:
        outcomes.append("lost")


async def test_dynamodb_local_race_between_independent_clients(dynamodb_local_table: DynamoTable) -> None:
    # Eight threads, each with its own client and connection pool, hit the emulator at the same moment.
    contenders = [dynamodb_local_table.store() for _ in range(8)]
    store = dynamodb_local_table.store()
    doc = await store.create(FLOW)
    for round_no in range(5):
        base = await store.load(doc.id)
        assert base is not None
        barrier = threading.Barrier(len(contenders))
        outcomes: list[str] = []
        threads = [
            threading.Thread(target=_contend, args=(own, base, n, barrier, outcomes))
            for n, own in enumerate(contenders)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        winners = [o for o in outcomes if o.startswith("won")]
        assert len(outcomes) == len(contenders) and len(winners) == 1, f"round {round_no}: {outcomes}"
        stored = await store.load(doc.id)
        assert stored is not None and stored.revision == base.revision + 1
        assert f"won:{stored.flow.context['writer']}" == winners[0]
    for own in [*contenders, store]:
        await own.close()


# --- store selection ---------------------------------------------------------------------------


def test_store_from_env_defaults_to_memory() -> None:
    assert isinstance(store_from_env({}), MemorySessionStore)
    assert isinstance(store_from_env({"SESSION_STORE": " memory "}), MemorySessionStore)


def test_store_from_env_sqlite(tmp_path: Path) -> None:
    store = store_from_env({"SESSION_STORE": "sqlite", "SQLITE_PATH": str(tmp_path / "x.sqlite")})
    assert isinstance(store, SQLiteSessionStore) and store.path == str(tmp_path / "x.sqlite")


def test_store_from_env_dynamodb() -> None:
    store = store_from_env(
        {
            "SESSION_STORE": "DYNAMODB",
            "SESSION_TABLE": "sessions",
            "DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:8000",
            "AWS_REGION": "eu-west-1",
            "SESSION_TTL_SECONDS": "86400",
        }
    )
    assert isinstance(store, DynamoDBSessionStore)
    assert (store.table_name, store.endpoint_url, store.region_name, store.ttl_seconds) == (
        "sessions",
        "http://127.0.0.1:8000",
        "eu-west-1",
        86400,
    )


def test_store_from_env_dynamodb_needs_a_table() -> None:
    with pytest.raises(PicoFlowError, match="SESSION_TABLE"):
        store_from_env({"SESSION_STORE": "DYNAMODB"})


def test_store_from_env_rejects_unknown_stores() -> None:
    with pytest.raises(PicoFlowError, match=r"No valid session store 'MONGO'\. Use MEMORY, SQLITE or DYNAMODB\."):
        store_from_env({"SESSION_STORE": "mongo"})
