"""Erasing one principal: ``delete_owner`` on the stores beyond the conformance suite, ``DELETE /ai/me`` through the
Lambda handler, and ``picoflow erase --owner``.

The conformance suite (``owner_erasure``) already runs ``delete_owner`` on memory, SQLite, moto and DynamoDB Local;
here: the DynamoDB store reads the owner index and never scans, nothing of the owner is left in the raw table, an
effect recorded by a real turn is erased with its session, a SQLite file written before erasure existed is
brought up to date, and the file stores remove the owner's uploads only.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import BaseModel

import handlers.api as api
from picoflow import Flow, FlowEngine, ModelSelection, Step, stay, tool
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.files.local_store import LocalFileStore
from picoflow.files.refs import new_file_id
from picoflow.files.s3_store import UPLOAD_PREFIX, S3FileStore
from picoflow.files.store import FileRecord, owner_tag
from picoflow.local.cli import main
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.dynamodb_store import OWNER_INDEX, DynamoDBSessionStore
from picoflow.session.sqlite_store import SQLiteSessionStore
from picoflow.session.store import SessionStore
from tests.support import echo_flows
from tests.support.dynamodb_local import REGION, DynamoTable

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

ALICE = {"sub": "alice-123"}
BOB = {"sub": "bob-456"}


class Order(BaseModel):
    order: str


class RefundStep(Step):
    def get_prompt(self) -> str:
        return "Refund orders."

    @tool(effect=True)
    async def refund(self, args: Order) -> Any:
        """Refund an order."""
        return stay(f"Refunded {args.order}.")


class RefundFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="refunds", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [RefundStep(self)]


def refund_turn() -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "refund", "args": {"order": "A1"}, "id": "call-1"}]},
        {"content": "Done."},
    ]


def raw_items(table: DynamoTable) -> list[dict[str, Any]]:
    """Every item of the table (a scan is fine in a test: it is what the store must never need)."""
    return table.client.scan(TableName=table.name, ConsistentRead=True)["Items"]


@pytest.fixture(params=["moto", "dynamodb-local"])
def dynamo(request: pytest.FixtureRequest) -> DynamoTable:
    return request.getfixturevalue("moto_dynamodb" if request.param == "moto" else "dynamodb_local_table")


async def test_a_turns_session_and_journal_entry_are_erased_without_a_scan(dynamo: DynamoTable) -> None:
    store = dynamo.store()
    engine = FlowEngine([RefundFlow], store, [ScriptedProvider(refund_turn() + refund_turn())], retry_delay=0)
    alice = await engine.run("RefundFlow", "refund A1", caller="alice-123")
    bob = await engine.run("RefundFlow", "refund A1", caller="bob-456")
    assert alice.success and bob.success
    owners = [item.get("owner", {}).get("S") for item in raw_items(dynamo)]
    # A session and a journal entry each, both carrying their owner.
    assert sorted(owners) == ["alice-123", "alice-123", "bob-456", "bob-456"]

    operations: list[str] = []
    store.client.meta.events.register("before-call.dynamodb.*", lambda model, **_: operations.append(model.name))
    assert await store.delete_owner("alice-123") == 1

    assert "Scan" not in operations and operations.count("Query") >= 1
    left = raw_items(dynamo)
    assert {item["owner"]["S"] for item in left} == {"bob-456"} and len(left) == 2
    assert all("alice-123" not in json.dumps(item, default=str) for item in left)
    assert await store.load(alice.session) is None and await store.load(bob.session) is not None
    await store.close()


async def test_the_owner_index_is_followed_page_by_page(moto_dynamodb: DynamoTable) -> None:
    store = moto_dynamodb.store()
    for _ in range(30):
        await store.create({"name": "HotelFlow"}, owner="many")
    pages: list[dict[str, Any]] = []

    def small_pages(params: dict[str, Any], **_: Any) -> None:
        if params.get("IndexName") == OWNER_INDEX:
            params["Limit"] = 7
            pages.append(params)

    store.client.meta.events.register("provide-client-params.dynamodb.Query", small_pages)
    assert await store.delete_owner("many") == 30
    assert len(pages) >= 5
    assert raw_items(moto_dynamodb) == []
    await store.close()


async def test_a_sqlite_file_from_before_erasure_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    store = SQLiteSessionStore(path)
    owned = await store.create({"name": "HotelFlow"}, owner="alice-123")
    anonymous = await store.create({"name": "HotelFlow"})
    await store.close()
    with sqlite3.connect(path) as conn:
        # The schema as it was: no owner columns.
        conn.execute("DROP INDEX session_owner")
        conn.execute("DROP INDEX effect_journal_owner")
        conn.execute("ALTER TABLE session DROP COLUMN owner")
        conn.execute("ALTER TABLE effect_journal DROP COLUMN owner")
    reopened = SQLiteSessionStore(path)
    assert await reopened.delete_owner("alice-123") == 1
    assert await reopened.load(owned.id) is None and await reopened.load(anonymous.id) is not None
    await reopened.close()


def record(owner: str | None) -> FileRecord:
    return FileRecord(id=new_file_id(), name="a.png", content_type="image/png", size=3, owner=owner_tag(owner),
                      expires_at=2_000_000_000)


async def test_the_local_file_store_removes_the_owners_files_only(tmp_path: Path) -> None:
    files = LocalFileStore(tmp_path / "uploads")
    mine, theirs, anonymous = record("alice-123"), record("bob-456"), record(None)
    for item in (mine, theirs, anonymous):
        await files.put(item, b"abc")
    assert await files.delete_owner("alice-123") == 1
    assert await files.describe(mine.id) is None and not list((tmp_path / "uploads").glob(f"{mine.id}*"))
    assert await files.describe(theirs.id) is not None and await files.describe(anonymous.id) is not None
    with pytest.raises(ValueError):
        await files.delete_owner("")


async def test_the_s3_file_store_removes_the_owners_files_only(aws_credentials: None) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket="files")
        client.put_object(Bucket="files", Key="elsewhere/keep", Body=b"x")
        files = S3FileStore("files", client=client)
        mine = [record("alice-123") for _ in range(3)]
        theirs = record("bob-456")
        for item in (*mine, theirs):
            await files.put(item, b"abc")
        assert await files.delete_owner("alice-123") == 3
        keys = sorted(obj["Key"] for obj in client.list_objects_v2(Bucket="files")["Contents"])
        assert keys == sorted(["elsewhere/keep", UPLOAD_PREFIX + theirs.id])


# --- DELETE /ai/me through the Lambda handler ---------------------------------------------------------------


class Api:
    def __init__(self, table: DynamoTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.table = table
        script = tmp_path / "script.json"
        script.write_text(json.dumps([{"content": f"reply {n}"} for n in range(10)]))
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))

    def call(self, method: str, path: str, body: Any = None, claims: dict[str, Any] | None = None) -> tuple[int, Any]:
        event = http_event(method, path, body=body)
        if claims is not None:
            event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], json.loads(result["body"])


@pytest.fixture
def http(moto_dynamodb: DynamoTable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    monkeypatch.setenv("FILES_FOLDER", str(tmp_path / "uploads"))
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "PICOFLOW_PRINCIPAL_CLAIM",
                 "FILES_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    aws_runtime.reset_runtime()
    yield Api(moto_dynamodb, tmp_path, monkeypatch)
    aws_runtime.reset_runtime()


def test_delete_me_erases_the_callers_sessions_and_files_and_nothing_else(http: Api) -> None:
    sessions = {}
    for who, claims in (("alice", ALICE), ("bob", BOB)):
        status, body = http.call("POST", "/ai/run", {"flowName": "EchoFlow", "message": "hi"}, claims)
        assert status == 200
        sessions[who] = body["session"]
        status, _ = http.call("POST", "/ai/files", {"name": "a.png", "contentType": "image/png", "size": 3}, claims)
        assert status == 200
    status, anonymous = http.call("POST", "/ai/run", {"flowName": "EchoFlow", "message": "hi"})
    assert status == 200

    status, body = http.call("DELETE", "/ai/me", claims=ALICE)
    assert (status, body) == (200, {"success": True, "sessions": 1, "files": 1})
    stored = {item["id"]["S"] for item in raw_items(http.table)}
    assert stored == {sessions["bob"], anonymous["session"]}
    store = aws_runtime.get_engine().file_store
    assert store is not None
    folder = Path(store.folder)  # type: ignore[attr-defined]
    owners = {json.loads(path.read_text())["owner"] for path in folder.glob("f_*.json")}
    assert owners == {owner_tag("bob-456")}

    # Again: nothing left, still a success.
    assert http.call("DELETE", "/ai/me", claims=ALICE) == (200, {"success": True, "sessions": 0, "files": 0})


def test_delete_me_needs_a_principal(http: Api) -> None:
    status, body = http.call("DELETE", "/ai/me")
    assert status == 401 and body["code"] == "UNAUTHENTICATED"
    assert body["message"] == "This request needs a signed-in caller."


def test_delete_me_answers_503_when_the_store_fails(http: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from picoflow.errors import SessionStoreError

    async def failing(self: SessionStore, owner: str) -> int:
        raise SessionStoreError("delete_owner", "", "ThrottlingException: slow down", status_code=503)

    monkeypatch.setattr(DynamoDBSessionStore, "delete_owner", failing)
    result = api.lambda_handler(_me_event(), FakeLambdaContext())
    body = json.loads(result["body"])
    assert result["statusCode"] == 503 and body["code"] == "SESSION_STORE_ERROR"
    assert "Throttling" not in result["body"] and result["headers"]["Retry-After"] == "2"


def _me_event() -> dict[str, Any]:
    event = http_event("DELETE", "/ai/me")
    event["requestContext"]["authorizer"] = {"jwt": {"claims": ALICE, "scopes": None}}
    return event


# --- picoflow erase ---------------------------------------------------------------------------------------------


def test_the_erase_command_erases_one_principal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sessions.sqlite"

    async def prepare() -> tuple[list[str], str]:
        store = SQLiteSessionStore(path)
        gone = [(await store.create({"name": "HotelFlow"}, owner="alice-123")).id for _ in range(2)]
        kept = (await store.create({"name": "HotelFlow"}, owner="bob-456")).id
        await store.close()
        await LocalFileStore(tmp_path / "uploads").put(record("alice-123"), b"abc")
        return gone, kept

    async def stored(ids: list[str]) -> list[bool]:
        store = SQLiteSessionStore(path)
        found = [await store.load(session_id) is not None for session_id in ids]
        await store.close()
        return found

    gone, kept = asyncio.run(prepare())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SESSION_STORE", raising=False)
    monkeypatch.delenv("FILES_BUCKET", raising=False)
    monkeypatch.setenv("SQLITE_PATH", str(path))
    monkeypatch.setenv("FILES_FOLDER", str(tmp_path / "uploads"))

    assert main(["erase", "--owner", "alice-123"]) == 0
    assert capsys.readouterr().out.strip() == "Erased 2 session(s) and 1 file(s)."
    assert asyncio.run(stored([*gone, kept])) == [False, False, True]
    assert main(["erase", "--owner", " "]) == 2
