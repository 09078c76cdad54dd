"""Files through ``picoflow serve`` with the real OpenAI model class talking to a fake server that records requests.

The upload goes to the server's own upload URL (a local folder stands in for S3); the recorded Chat
Completions requests must carry the very bytes uploaded, as an image part or a PDF file part.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from picoflow.files.intake import open_upload
from picoflow.files.local_store import LocalFileStore
from picoflow.files.policy import FilePolicy
from picoflow.local.chat import ChatClient, UploadError
from tests.support.browser import ApiServer
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, usage_block
from tests.support.files import EXECUTABLE, INVOICE_PDF, INVOICE_PNG, contains_file, invoice_replies

UPLOAD_NAME = "invoice"


def _openai_replies() -> list[dict[str, Any]]:
    """InvoiceFlow's scripted replies as Chat Completions answers (the date, fetch_file of the upload, capture)."""
    route, opened, captured = invoice_replies(UPLOAD_NAME)
    calls = [
        [{"id": f"call_{n}", "name": call["name"], "args": call["args"]} for call in reply["tool_calls"]]
        for n, reply in enumerate((opened, captured))
    ]
    return [
        chat_completion(content=route["content"], usage=usage_block(1100, 20)),
        chat_completion(tool_calls=calls[0], usage=usage_block(400, 15)),
        chat_completion(tool_calls=calls[1], usage=usage_block(1500, 160)),
    ]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ApiServer, FakeOpenAIServer]]:
    with FakeOpenAIServer(_openai_replies()) as model:
        env = {"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model.url + "/v1", "NO_PROXY": "127.0.0.1,localhost"}
        server = ApiServer(tmp_path / "api", None, None, flows="flows.invoice", env=env)
        try:
            yield server, model
        finally:
            server.stop()


def _data_url_bytes(url: str, content_type: str) -> bytes:
    prefix = f"data:{content_type};base64,"
    assert url.startswith(prefix)
    return base64.b64decode(url[len(prefix):])


def _sent_files(request: dict[str, Any]) -> list[tuple[str, bytes]]:
    found = []
    for message in request["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part["type"] == "image_url":
                found.append(("image", _data_url_bytes(part["image_url"]["url"], "image/png")))
            elif part["type"] == "file":
                found.append(("pdf", _data_url_bytes(part["file"]["file_data"], "application/pdf")))
    return found


@pytest.mark.parametrize(("content_type", "data", "kind"), [
    ("image/png", INVOICE_PNG, "image"),
    ("application/pdf", INVOICE_PDF, "pdf"),
])
def test_an_upload_through_serve_reaches_openai_as_its_own_part(served, content_type, data, kind):
    server, model = served
    client = ChatClient(server.url, "InvoiceFlow")

    file_id = client.upload(UPLOAD_NAME, content_type, data)
    reply = client.send("Please extract this invoice.", [file_id])

    assert reply.status == 200, reply.text
    assert reply.content_type == "application/json"
    record = json.loads(reply.text)
    assert (record["bill_number"], record["total"]) == ("NW-2026-0142", 7564.24)
    route, fetch, extract = model.requests
    assert _sent_files(route) == _sent_files(fetch) == []  # the routing step never sees the file
    assert _sent_files(extract) == [(kind, data)]
    [doc] = server.stored_sessions().values()
    assert not contains_file(json.dumps(doc), data)
    assert file_id in json.dumps(doc["flow"]["memory"])
    assert doc["tokens"]["inputTokens"] == 3000


def test_serve_refuses_an_executable_renamed_png_and_a_tampered_upload(served):
    server, model = served
    client = ChatClient(server.url, "InvoiceFlow")
    file_id = client.upload("invoice.png", "image/png", EXECUTABLE)
    reply = client.send("Please extract this invoice.", [file_id])
    assert reply.status == 415 and reply.envelope["code"] == "FILE_CONTENT_MISMATCH"
    with pytest.raises(UploadError) as refused:
        client.upload("big.png", "image/png", INVOICE_PNG + b"\x00" * (6 * 1024 * 1024))
    assert refused.value.status == 413
    assert model.requests == []
    assert server.stored_sessions() == {}


async def test_a_local_upload_url_takes_only_the_signed_type_size_and_id(tmp_path):

    store = LocalFileStore(tmp_path)
    ticket = await open_upload(store, FilePolicy(), name="a.png", content_type="image/png", size=len(INVOICE_PNG),
                               caller=None, session_id=None)
    query = dict(part.split("=", 1) for part in ticket.upload_url.split("?", 1)[1].split("&"))
    assert store.accept_upload(ticket.file_id, {**query, "signature": "0" * 64}, "image/png", INVOICE_PNG) == 403
    assert store.accept_upload(ticket.file_id, query, "application/pdf", INVOICE_PNG) == 403
    assert store.accept_upload(ticket.file_id, query, "image/png", INVOICE_PNG[:-1]) == 403
    assert store.accept_upload("../" + ticket.file_id, query, "image/png", INVOICE_PNG) == 404
    assert await store.describe(ticket.file_id) is None
    assert store.accept_upload(ticket.file_id, query, "image/png", INVOICE_PNG) == 200
    assert await store.read(ticket.file_id, len(INVOICE_PNG)) == INVOICE_PNG
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith(".")) == [
        f"{ticket.file_id}.bin", f"{ticket.file_id}.json",
    ]


def test_serve_stores_an_inline_file_only_for_a_turn_that_runs_and_once_per_key(served, tmp_path):
    server, model = served
    inline = {"name": UPLOAD_NAME, "contentType": "image/png", "data": base64.b64encode(INVOICE_PNG).decode()}
    key = {"Idempotency-Key": "serve-inline-turn-5b7e0c1d2f3a4b6c8d9e0f1a"}
    stored = tmp_path / "api" / "uploads"

    def run(flow: str, message: str, headers: dict[str, str] | None = None) -> requests.Response:
        body = {"flowName": flow, "message": message, "files": [inline]}
        return requests.post(f"{server.url}/ai/run", json=body, headers=headers, timeout=30)

    def files() -> list[str]:
        return sorted(path.name for path in stored.glob("*.bin"))

    unknown = run("NoSuchFlow", "Please extract this invoice.")
    assert (unknown.status_code, unknown.json()["code"]) == (400, "FLOW_NOT_FOUND")
    assert files() == []

    first = run("InvoiceFlow", "Please extract this invoice.", key)
    assert first.status_code == 200, first.text
    assert len(files()) == 1
    replayed = run("InvoiceFlow", "Please extract this invoice.", key)
    mismatched = run("InvoiceFlow", "Another request under the same key.", key)

    assert replayed.status_code == 200 and replayed.json() == first.json()
    assert (mismatched.status_code, mismatched.json()["code"]) == (422, "IDEMPOTENCY_KEY_MISMATCH")
    assert len(files()) == 1
    assert len(model.requests) == 3
