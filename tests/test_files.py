"""Files through the Lambda handler on moto (S3 and DynamoDB): uploads, attachment to a turn, refusals.

Every turn runs InvoiceFlow on its scripted replies; the scripted model records what each call received,
so a test can compare the image or PDF the model got with the bytes uploaded.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
import requests

import handlers.api as api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.api import openapi_schema
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import PUBLIC_MESSAGES
from picoflow.files import store as file_store
from picoflow.files.refs import new_file_id
from picoflow.files.s3_store import S3FileStore
from picoflow.files.store import FileRecord
from tests.support.files import EXECUTABLE, INVOICE_PDF, INVOICE_PNG, b64, contains_file, invoice_replies

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

BUCKET = "picoflow-files-test"
MAX_FILE_BYTES = 20_000


class FilesApi:
    def __init__(self, table: Any, s3: Any, script: Path) -> None:
        self.table = table
        self.s3 = s3
        self.script = script

    def script_fetching(self, file_name: str) -> None:
        """Script the model to fetch ``file_name``; before the first request, which reads the script."""
        self.script.write_text(json.dumps(invoice_replies(file_name) * 3))

    def call(self, path: str, body: Any, *, claims: dict | None = None, session: str | None = None,
             key: str | None = None):
        headers = {**({"CHAT_SESSION_ID": session} if session else {}), **({"Idempotency-Key": key} if key else {})}
        event = http_event("POST", path, body=body, headers=headers or None)
        if claims is not None:
            event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        headers = {k.lower(): v for k, v in result.get("headers", {}).items()}
        return result["statusCode"], headers, result.get("body") or ""

    def open_upload(self, name: str, content_type: str, size: int, **options: Any):
        status, _, body = self.call("/ai/files", {"name": name, "contentType": content_type, "size": size}, **options)
        return status, json.loads(body)

    def upload(self, data: bytes, content_type: str = "image/png", name: str = "invoice.png", **options: Any) -> str:
        status, ticket = self.open_upload(name, content_type, len(data), **options)
        assert status == 200, ticket
        assert ticket["expiresIn"] > 0
        put = requests.put(ticket["uploadUrl"], data=data, headers=ticket["uploadHeaders"], timeout=10)
        assert put.status_code == 200
        return ticket["fileId"]

    def run(self, files: list[Any], message: str = "Please extract this invoice.", flow: str = "InvoiceFlow",
            **options: Any):
        return self.call("/ai/run", {"flowName": flow, "message": message, "files": files}, **options)

    def documents(self) -> list[dict[str, Any]]:
        items = self.table.client.scan(TableName=self.table.name, ConsistentRead=True)["Items"]
        return [json.loads(zlib.decompress(item["doc"]["B"])) for item in items]

    def objects(self) -> list[str]:
        return [item["Key"] for item in self.s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]

    def model_calls(self) -> list[list[Any]]:
        return aws_runtime.get_runtime().engine.providers.override.calls


@pytest.fixture
def files_api(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[FilesApi]:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(invoice_replies() * 3))
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", "flows.invoice")
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setenv("FILES_BUCKET", BUCKET)
    monkeypatch.setenv("PICOFLOW_MAX_FILE_BYTES", str(MAX_FILE_BYTES))
    for name in ("FILES_FOLDER", "OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield FilesApi(moto_dynamodb, s3, script)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def _sent_parts(call: list[Any]) -> list[dict[str, Any]]:
    return [part for message in call if isinstance(message.content, list) for part in message.content
            if isinstance(part, dict) and part.get("type") in ("image", "file")]


def _assert_extracted(status: int, headers: dict[str, str], body: str) -> dict[str, Any]:
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    assert headers["chat_session_id"]
    record = json.loads(body)
    capture = invoice_replies()[2]["tool_calls"][0]["args"]["json"]
    assert (record["vendor_name"], record["bill_number"]) == (capture["vendor_name"], capture["bill_number"])
    assert [item["extended_price"] for item in record["invoice_items"]] == [
        item["extended_price"] for item in capture["invoice_items"]]
    return record


@pytest.mark.parametrize(("data", "content_type", "part_type"), [
    (INVOICE_PNG, "image/png", "image"),
    (INVOICE_PDF, "application/pdf", "file"),
])
def test_an_uploaded_file_reaches_the_model_and_the_document_keeps_only_its_reference(
    files_api, data, content_type, part_type
):
    file_id = files_api.upload(data, content_type, name="scans/../invoice.png")

    status, headers, body = files_api.run([file_id])

    _assert_extracted(status, headers, body)
    # The routing call never sees the user's file; the extraction call gets it once its step attached it.
    route, fetch, extract = files_api.model_calls()
    assert _sent_parts(route) == _sent_parts(fetch) == []
    [part] = _sent_parts(extract)
    assert part["type"] == part_type
    assert part["mime_type"] == content_type
    assert base64.b64decode(part["base64"]) == data
    [doc] = files_api.documents()
    text = json.dumps(doc)
    assert not contains_file(text, data)
    extraction = next(step for step in doc["flow"]["steps"] if step["name"] == "ExtractInvoiceStep")
    assert extraction["state"]["fileName"] == "invoice.png"  # the display name: no path survives
    [human] = [m for m in doc["flow"]["memory"]["invoice3"]["messages"] if isinstance(m["content"], list)]
    assert "invoice.png" in human["content"][0]["text"]
    ref = human["content"][1]
    assert ref["type"] == "file_ref" and ref["id"] == file_id
    assert ref["contentType"] == content_type and ref["size"] == len(data) and ref["digest"].startswith("sha256:")
    assert files_api.objects() == [f"uploads/{file_id}"]


def test_a_small_inline_file_is_stored_like_an_upload(files_api):
    inline = {"name": "invoice.png", "contentType": "image/png", "data": b64(INVOICE_PNG)}

    status, headers, body = files_api.run([inline])

    _assert_extracted(status, headers, body)
    [key] = files_api.objects()
    assert files_api.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == INVOICE_PNG
    assert not contains_file(json.dumps(files_api.documents()), INVOICE_PNG)


def test_a_signed_in_callers_file_serves_that_caller(files_api):
    alice = {"sub": "alice"}
    file_id = files_api.upload(INVOICE_PNG, claims=alice)
    _assert_extracted(*files_api.run([file_id], claims=alice))


def _refused(files_api: FilesApi, answer: tuple[int, dict[str, str], str], status: int, code: str) -> None:
    got_status, headers, body = answer
    envelope = json.loads(body)
    assert (got_status, envelope["code"]) == (status, code), body
    assert envelope["success"] is False
    assert envelope["message"] == PUBLIC_MESSAGES[code]
    assert headers["content-type"] == "application/json"
    assert files_api.documents() == []


def test_an_upload_over_the_size_limit_is_413_before_any_url(files_api):
    status, body = files_api.open_upload("big.png", "image/png", MAX_FILE_BYTES + 1)
    assert (status, body["code"]) == (413, "FILE_TOO_LARGE")
    assert "uploadUrl" not in body


def test_an_inline_file_over_the_size_limit_is_413_and_nothing_is_stored(files_api):
    big = INVOICE_PNG + b"\x00" * MAX_FILE_BYTES
    _refused(files_api, files_api.run([{"name": "big.png", "contentType": "image/png", "data": b64(big)}]),
             413, "FILE_TOO_LARGE")
    assert files_api.objects() == []


@pytest.mark.parametrize("content_type", ["image/svg+xml", "application/x-msdownload", "text/html"])
def test_a_type_outside_the_allow_list_is_415(files_api, content_type):
    status, body = files_api.open_upload("file", content_type, 100)
    assert (status, body["code"]) == (415, "FILE_TYPE_NOT_ALLOWED")
    inline = {"name": "file", "contentType": content_type, "data": b64(INVOICE_PNG)}
    _refused(files_api, files_api.run([inline]), 415, "FILE_TYPE_NOT_ALLOWED")
    assert files_api.objects() == []


def test_an_executable_renamed_png_is_refused_uploaded_or_inline(files_api):
    file_id = files_api.upload(EXECUTABLE, "image/png", name="invoice.png")
    _refused(files_api, files_api.run([file_id]), 415, "FILE_CONTENT_MISMATCH")
    inline = {"name": "invoice.png", "contentType": "image/png", "data": b64(EXECUTABLE)}
    _refused(files_api, files_api.run([inline]), 415, "FILE_CONTENT_MISMATCH")
    assert files_api.objects() == [f"uploads/{file_id}"]
    assert files_api.model_calls() == []


def test_bytes_that_differ_from_the_declared_size_are_refused_on_use(files_api):
    status, ticket = files_api.open_upload("invoice.png", "image/png", len(INVOICE_PNG) - 1)
    assert status == 200
    # S3 itself refuses a PUT whose length differs from the signed one; the check on use does not rely on it.
    requests.put(ticket["uploadUrl"], data=INVOICE_PNG, headers=ticket["uploadHeaders"], timeout=10)
    _refused(files_api, files_api.run([ticket["fileId"]]), 415, "FILE_CONTENT_MISMATCH")


@pytest.mark.parametrize("runner", [{"sub": "mallory"}, None])
def test_another_principals_file_is_refused_like_an_unknown_one(files_api, runner):
    file_id = files_api.upload(INVOICE_PNG, claims={"sub": "alice"})
    _refused(files_api, files_api.run([file_id], claims=runner), 404, "FILE_NOT_FOUND")
    assert files_api.model_calls() == []


def test_a_file_uploaded_for_a_session_serves_only_that_session(files_api):
    file_id = files_api.upload(INVOICE_PNG, session="someone-elses-session")
    _refused(files_api, files_api.run([file_id]), 404, "FILE_NOT_FOUND")


def test_an_expired_file_is_refused_like_an_unknown_one(files_api, monkeypatch):
    file_id = files_api.upload(INVOICE_PNG)
    later = file_store.time.time() + 2 * 86_400
    monkeypatch.setattr(file_store.time, "time", lambda: later)
    _refused(files_api, files_api.run([file_id]), 404, "FILE_NOT_FOUND")


@pytest.mark.parametrize("file_id", [new_file_id(), "../../etc/passwd", "uploads/x", "f_" + "A" * 32])
def test_an_unknown_file_id_is_404(files_api, file_id):
    _refused(files_api, files_api.run([file_id]), 404, "FILE_NOT_FOUND")


def test_more_files_than_the_turn_allows_are_refused_before_any_is_read(files_api):
    inline = {"name": "invoice.png", "contentType": "image/png", "data": b64(INVOICE_PNG)}
    _refused(files_api, files_api.run([inline] * 5), 400, "TOO_MANY_FILES")
    assert files_api.objects() == []


def test_inline_data_that_is_not_base64_is_refused(files_api):
    inline = {"name": "invoice.png", "contentType": "image/png", "data": "not base64!"}
    _refused(files_api, files_api.run([inline]), 400, "FILE_DATA_INVALID")


def test_without_a_file_store_the_api_refuses_files(files_api, monkeypatch):
    monkeypatch.delenv("FILES_BUCKET")
    status, body = files_api.open_upload("invoice.png", "image/png", 100)
    assert (status, body["code"]) == (400, "FILES_DISABLED")
    _refused(files_api, files_api.run([new_file_id()]), 400, "FILES_DISABLED")


def test_the_routes_are_in_the_openapi_document():
    schema = openapi_schema()
    assert "/ai/files" in schema["paths"]
    assert "files" in schema["components"]["schemas"]["RunRequest"]["properties"]


# -- names: cut by their UTF-8 bytes, so S3's 2 KB of user metadata always holds the record ----------------

S3_METADATA_LIMIT = 2048
FOUR_BYTE_NAME = "\U0001F600" * 300  # 1,200 UTF-8 bytes; 3,600 once percent-encoded for S3


def _metadata_size(metadata: dict[str, str]) -> int:
    # As S3 counts it, with each key's header prefix on top (so the check errs on the strict side).
    return sum(len(f"x-amz-meta-{key}".encode()) + len(value.encode()) for key, value in metadata.items())


def _stored_metadata(files_api: FilesApi, file_id: str) -> dict[str, str]:
    return files_api.s3.head_object(Bucket=BUCKET, Key=f"uploads/{file_id}")["Metadata"]


def test_a_name_of_300_four_byte_characters_is_cut_to_whole_characters_s3_accepts(files_api):
    files_api.script_fetching("\U0001F600" * 63)
    status, ticket = files_api.open_upload(FOUR_BYTE_NAME, "image/png", len(INVOICE_PNG))
    assert status == 200, ticket
    signed = {key[len("x-amz-meta-"):]: value for key, value in ticket["uploadHeaders"].items()
              if key.startswith("x-amz-meta-")}
    assert _metadata_size(signed) <= S3_METADATA_LIMIT
    put = requests.put(ticket["uploadUrl"], data=INVOICE_PNG, headers=ticket["uploadHeaders"], timeout=10)
    assert put.status_code == 200
    assert unquote(_stored_metadata(files_api, ticket["fileId"])["name"]) == "\U0001F600" * 63

    _assert_extracted(*files_api.run([ticket["fileId"]]))

    assert any(_sent_parts(call) for call in files_api.model_calls())


def test_an_inline_file_with_a_long_name_is_stored_under_the_cut_name(files_api):
    files_api.script_fetching("\U0001F600" * 63)
    inline = {"name": FOUR_BYTE_NAME, "contentType": "image/png", "data": b64(INVOICE_PNG)}

    _assert_extracted(*files_api.run([inline]))

    [key] = files_api.objects()
    metadata = _stored_metadata(files_api, key.removeprefix("uploads/"))
    assert _metadata_size(metadata) <= S3_METADATA_LIMIT
    assert unquote(metadata["name"]) == "\U0001F600" * 63


def test_a_10_kb_name_is_cut_keeping_its_suffix_and_a_blank_one_is_refused_truthfully(files_api):
    status, ticket = files_api.open_upload("scan-" * 2048 + ".png", "image/png", len(INVOICE_PNG))
    assert status == 200, ticket
    requests.put(ticket["uploadUrl"], data=INVOICE_PNG, headers=ticket["uploadHeaders"], timeout=10)
    name = unquote(_stored_metadata(files_api, ticket["fileId"])["name"])
    assert name.startswith("scan-scan-") and name.endswith(".png") and len(name.encode()) == 255

    status, body = files_api.open_upload("   ", "image/png", len(INVOICE_PNG))
    assert (status, body["message"]) == (400, "name must be a non-empty string.")


async def test_the_s3_store_fits_any_record_name_into_the_metadata_limit(files_api):
    store = S3FileStore(BUCKET, client=files_api.s3)
    record = FileRecord(id=new_file_id(), name="\u00e9" * 2000, content_type="image/png", size=len(INVOICE_PNG),
                        owner="o" * 32, session="s" * 128, expires_at=2_000_000_000)

    await store.put(record, INVOICE_PNG)

    assert _metadata_size(_stored_metadata(files_api, record.id)) <= S3_METADATA_LIMIT
    described = await store.describe(record.id)
    assert described is not None and described.session == "s" * 128
    assert described.name == "\u00e9" * len(described.name) and 200 < len(described.name) < 2000


# -- inline files are stored only once the request has passed every check -----------------------------------

INLINE = {"name": "invoice.png", "contentType": "image/png", "data": b64(INVOICE_PNG)}
KEY = "inline-invoice-turn-7c1f9e2a4b5d4e0f8a9b3c6d"


def test_an_inline_file_for_an_unknown_flow_is_not_stored(files_api):
    status, _, body = files_api.run([INLINE], flow="NoSuchFlow")

    assert (status, json.loads(body)["code"]) == (400, "FLOW_NOT_FOUND")
    assert files_api.objects() == []


def test_a_replayed_turn_stores_no_second_copy_and_a_reused_key_stores_nothing(files_api):
    first = files_api.run([INLINE], key=KEY)
    _assert_extracted(*first)
    stored = files_api.objects()
    assert len(stored) == 1

    replayed = files_api.run([INLINE], key=KEY)
    assert replayed[0] == 200 and replayed[2] == first[2]
    reused = files_api.run([INLINE], message="Something else entirely.", key=KEY)
    assert (reused[0], json.loads(reused[2])["code"]) == (422, "IDEMPOTENCY_KEY_MISMATCH")

    assert files_api.objects() == stored
    assert len(files_api.model_calls()) == 3
