"""Sample files for the file tests: the bundled invoice image, a small PDF and an executable's first bytes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
INVOICE_PNG = (ROOT / "flows" / "invoice" / "sample_invoice.png").read_bytes()
# A one-page PDF whose only text is the invoice number: enough for a type check and a byte comparison.
INVOICE_PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 300 100]/Contents 4 0 R>>endobj\n"
    b"4 0 obj<</Length 44>>stream\nBT /F1 12 Tf 20 50 Td (Invoice INV-2041) Tj ET\nendstream endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)
# The start of a Windows executable: what a program renamed to invoice.png begins with.
EXECUTABLE = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 48


def invoice_replies(file_name: str = "invoice.png") -> list[dict[str, Any]]:
    """The scripted model replies of InvoiceFlow's bundled conversation (the date, fetch_file, capture_json),
    the model fetching ``file_name`` (an uploaded file's name) instead of the server's sample."""
    conversation = json.loads((ROOT / "flows" / "invoice" / "conversation.json").read_text(encoding="utf-8"))
    replies = [reply for turn in conversation["turns"] for reply in turn["replies"]]
    replies[1]["tool_calls"][0]["args"] = {"name": file_name}
    return replies


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def contains_file(text: str, data: bytes) -> bool:
    """Whether ``text`` holds ``data`` base64-encoded (a long prefix is enough to tell)."""
    return b64(data)[:64] in text
