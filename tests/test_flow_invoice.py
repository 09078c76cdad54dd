"""InvoiceFlow against the original tutorial's checks, through the Lambda handler, on its scripted conversation.

The original checks the HTTP body against the invoice contract (vendor, bill number, currency, total, balance
due, number of line items of ``invoice_example.json``) and that ``ExtractInvoiceStep``'s stored ``state.json``
equals the body. The sample the request names is a two-page PDF the server holds; its routing step never sees it.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import handlers.api as api
from flows.invoice.steps import SAMPLES
from picoflow.aws.testing import HandlerResult, invoke, read_session, reset_runtime, scripted_calls

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

FOLDER = Path(__file__).resolve().parents[1] / "flows" / "invoice"
EXAMPLE = json.loads((FOLDER / "invoice_example.json").read_text(encoding="utf-8"))
CONVERSATION = json.loads((FOLDER / "conversation.json").read_text(encoding="utf-8"))
PDF = (FOLDER / "sample_invoice.pdf").read_bytes()


def replies() -> list[dict[str, Any]]:
    return copy.deepcopy([reply for turn in CONVERSATION["turns"] for reply in turn["replies"]])


@pytest.fixture
def lambda_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def configure(script: list[dict[str, Any]]) -> None:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(script))
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        reset_runtime()

    monkeypatch.setenv("SESSION_STORE", "SQLITE")
    monkeypatch.setenv("SQLITE_PATH", str(tmp_path / "sessions.sqlite"))
    monkeypatch.setenv("FILES_FOLDER", str(tmp_path / "files"))
    monkeypatch.setenv("PICOFLOW_FLOWS", "flows.invoice")
    for name in ("FILES_BUCKET", "OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    yield configure
    reset_runtime()


def run(message: str, config: dict[str, Any] | None = None, files: list[Any] | None = None) -> HandlerResult:
    body: dict[str, Any] = {"flowName": "InvoiceFlow", "message": message}
    if config is not None:
        body["config"] = config
    if files is not None:
        body["files"] = files
    return invoke(api.lambda_handler, "POST", "/ai/run", body=body)


def sent_files(call: list[Any]) -> list[dict[str, Any]]:
    return [part for message in call if isinstance(message.content, list) for part in message.content
            if isinstance(part, dict) and part.get("type") in ("image", "file")]


def expect_invoice_contract(invoice: dict[str, Any]) -> None:
    for key in ("vendor_name", "bill_number", "currency", "total", "balance_due"):
        assert invoice[key] == EXAMPLE[key], key
    assert isinstance(invoice["invoice_items"], list)
    assert len(invoice["invoice_items"]) == len(EXAMPLE["invoice_items"])


def test_the_sample_is_a_genuine_two_page_pdf_showing_the_example_invoice() -> None:
    assert PDF.startswith(b"%PDF-1.") and PDF.rstrip().endswith(b"%%EOF")
    assert len(PDF) < 10_000
    assert re.search(rb"/Type/Pages/Kids\[3 0 R 4 0 R\]/Count 2", PDF)
    # Every cross-reference entry points at the object it names.
    start = int(PDF.rsplit(b"startxref", 1)[1].split()[0])
    lines = PDF[start:].split(b"\n")
    count = int(lines[1].split()[1])
    for number in range(1, count):
        offset = int(lines[2 + number].split()[0])
        assert PDF[offset:].startswith(f"{number} 0 obj".encode())
    shown = " ".join(re.findall(r"\((.*?)\) Tj", PDF.decode("latin-1")))
    for value in (EXAMPLE["vendor_name"], EXAMPLE["bill_number"], EXAMPLE["bill_date"], EXAMPLE["po_number"],
                  "7,564.24", "5,064.24", "Page 2 of 2", *(item["spec_tag"] for item in EXAMPLE["invoice_items"])):
        assert value in shown, value


def test_the_original_checks_pass_and_the_routing_call_never_sees_the_file(lambda_env: Any) -> None:
    lambda_env(replies())

    result = run("Extract the named invoice into JSON.", {"fileName": "sample_invoice.pdf"})

    assert result.status == 200, result.body
    assert result.headers["content-type"] == "application/json"
    invoice = result.json()
    expect_invoice_contract(invoice)
    assert result.session
    doc = read_session(result.session)
    assert doc is not None
    assert doc["runStatus"] == "completed"
    assert doc["flow"]["name"] == "InvoiceFlow"
    steps = {step["name"]: step["state"] for step in doc["flow"]["steps"]}
    assert steps["ExtractInvoiceStep"]["json"] == invoice
    assert steps["ExtractInvoiceStep"]["fileName"] == "sample_invoice.pdf"
    assert steps["NoToolStep"]["current_date"] == {"year": 2023, "month": 1, "day": 1}
    assert steps["ExtractInvoiceStep"]["from_previous"] == steps["NoToolStep"]["current_date"]
    assert set(doc["flow"]["memory"]) == {"NoToolStep", "invoice3"}
    # The routing call gets no file; the extraction call after fetch_file gets the PDF the server holds.
    route, fetch, capture = scripted_calls()
    assert sent_files(route) == [] and sent_files(fetch) == []
    [part] = sent_files(capture)
    assert part["mime_type"] == "application/pdf" and base64.b64decode(part["base64"]) == PDF
    assert base64.b64encode(PDF).decode()[:64] not in json.dumps(doc)


def test_an_uploaded_invoice_waits_for_the_extraction_step(lambda_env: Any) -> None:
    script = replies()
    script[1]["tool_calls"][0]["args"] = {"name": "scan.pdf"}
    lambda_env(script)
    upload = {"name": "scan.pdf", "contentType": "application/pdf", "data": base64.b64encode(PDF).decode()}

    result = run("Extract this invoice.", files=[upload])

    assert result.status == 200, result.body
    expect_invoice_contract(result.json())
    route, fetch, capture = scripted_calls()
    assert sent_files(route) == [] and sent_files(fetch) == []
    assert '"scan.pdf"' in fetch[0].content  # the prompt names the uploaded file
    [part] = sent_files(capture)
    assert base64.b64decode(part["base64"]) == PDF
    doc = read_session(result.session or "")
    assert doc is not None
    assert all(isinstance(m["content"], str) for m in doc["flow"]["memory"]["NoToolStep"]["messages"])


def test_a_name_that_is_not_a_held_or_attached_file_is_refused_to_the_model(lambda_env: Any) -> None:
    script = replies()[:2]
    script[1]["tool_calls"][0]["args"] = {"name": "../../.env"}
    script.append({"content": "There is no such invoice file.", "usage": {"input_tokens": 5, "output_tokens": 5}})
    lambda_env(script)

    result = run("Extract the named invoice into JSON.", {"fileName": "../../.env"})

    assert result.status == 200, result.body
    assert result.json()["message"] == "There is no such invoice file."
    answer = scripted_calls()[2][-1]
    assert answer.type == "tool" and "There is no file named" in answer.content
    assert all(name in answer.content for name in SAMPLES)
    assert all(sent_files(call) == [] for call in scripted_calls())


def test_a_reply_without_the_date_is_asked_for_again(lambda_env: Any) -> None:
    script = replies()
    script.insert(0, {"content": "Sure! The date is January 1st.", "usage": {"input_tokens": 5, "output_tokens": 5}})
    lambda_env(script)

    result = run("Extract the named invoice into JSON.", {"fileName": "sample_invoice.pdf"})

    assert result.status == 200, result.body
    expect_invoice_contract(result.json())
    assert len(scripted_calls()) == 4


def test_a_held_file_is_checked_like_an_upload_and_keeps_one_id(tmp_path: Path) -> None:
    from picoflow.errors import PicoFlowError
    from picoflow.files.held import read_held_file
    from picoflow.files.policy import FilePolicy

    ref, data = read_held_file(FOLDER / "sample_invoice.pdf", "invoice.pdf")
    again, _ = read_held_file(FOLDER / "sample_invoice.pdf")
    assert (ref.name, ref.content_type, ref.size, data) == ("invoice.pdf", "application/pdf", len(PDF), PDF)
    assert again.id == ref.id and again.name == "sample_invoice.pdf"
    with pytest.raises(PicoFlowError, match="larger than"):
        read_held_file(FOLDER / "sample_invoice.pdf", policy=FilePolicy(max_file_bytes=len(PDF) - 1))
    with pytest.raises(PicoFlowError, match="allowed file type"):
        read_held_file(FOLDER / "steps.py")
    with pytest.raises(PicoFlowError, match="allowed file type"):
        read_held_file(FOLDER / "sample_invoice.png", policy=FilePolicy(allowed_types=frozenset({"application/pdf"})))
    with pytest.raises(PicoFlowError, match="cannot be read"):
        read_held_file(tmp_path / "missing.pdf")
