"""The two steps of InvoiceFlow.

``NoToolStep`` has no tools: its model answers with a small JSON object and ``on_response`` parses it, saves it
and routes on. ``ExtractInvoiceStep`` asks for the invoice with ``fetch_file``, gets it by re-entering itself
with a message that carries the file, and submits the record with ``capture_json``.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from flows.invoice.records import CaptureJson, FetchFile, as_record
from picoflow import Step, Transition, finish, go, load_prompt, prompt, render, stay, tool
from picoflow.files.refs import FileRef, with_files
from picoflow.messages import HumanMessageEx
from picoflow.parsing import parse_json
from picoflow.wire import JSON

HERE = Path(__file__).parent
#: The files the server holds for this flow, by the name a request's ``config.fileName`` gives.
SAMPLES: dict[str, Path] = {name: HERE / name for name in ("sample_invoice.pdf", "sample_invoice.png")}
#: The extraction prompt: the instructions, then the example that pins the record's shape.
FENCE = "`" * 3
EXTRACT_PROMPT = (
    load_prompt("invoice.md", __file__)
    + "\n## Extraction example\n" + FENCE + "json\n"
    + load_prompt("invoice_example.json", __file__)
    + FENCE + "\n"
)
#: The address ``NoToolStep`` hands its model; its zip code decides which date the model answers.
INTERNAL_ADDRESS = {"street": "500 Orchard Avenue", "city": "Hillsboro", "state": "OR"}
ZIP_CODES = ("97006", "97005")
OPENER = "Please extract the invoice."
NO_FILE_NAMED = "the file the user names (this request names none: if there is no file, say so)"
ATTACHED = (
    "The file '{name}' is attached to this message. Read the invoice from it; do not fetch it again. "
    "Then call capture_json."
)
ALREADY_ATTACHED = "The file '{name}' is already attached above: read the invoice from it and call capture_json."
UNKNOWN_FILE = "There is no file named {name}. Files you can fetch: {names}."
FETCH_FIRST = "Call fetch_file first: capture only what you read in the attached file."


def current_date(reply: Any) -> dict[str, Any] | None:
    """The ``current_date`` object of a reply (fenced or not), or None when the reply has none."""
    parsed = parse_json(reply) if isinstance(reply, str) else reply
    date = parsed.get("current_date", parsed) if isinstance(parsed, dict) else None
    if isinstance(date, dict) and all(isinstance(date.get(key), int) for key in ("year", "month", "day")):
        return date
    return None


class NoToolStep(Step):
    """Works out a date from its prompt and routes on; it has no tools and never sees the invoice."""

    def accepts_attachments(self) -> bool:
        # Uploaded files wait for the extraction step, which attaches the one the model asks for.
        return False

    def get_prompt(self) -> str:
        address = {**INTERNAL_ADDRESS, "zip": secrets.choice(ZIP_CODES)}
        return prompt("no_tool.md", __file__, internal_address=address)

    def check_response(self, result: Any) -> bool:
        # A reply without the date object is asked for again (within the step's retry attempts).
        return current_date(result.text if isinstance(result, BaseMessage) else result) is None

    async def on_response(self, result: Any) -> Transition:
        date = current_date(result)
        self.save_state({"current_date": date})
        return go(ExtractInvoiceStep).with_state({"from_previous": date})


class ExtractInvoiceStep(Step):
    """Attaches the requested invoice to its own conversation, then captures it as the answer."""

    def get_prompt(self) -> str:
        name = requested_file(self)
        return render(EXTRACT_PROMPT, FileName=json.dumps(name) if name else NO_FILE_NAMED)

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, OPENER)

    @tool
    async def fetch_file(self, args: FetchFile) -> Transition:
        """Attach the named invoice file to the conversation so that you can read it."""
        if self.get_state("fileName"):
            return stay(ALREADY_ATTACHED.format(name=self.get_state("fileName")))
        ref = self.find_file(args.name)
        if ref is None:
            names = [ref.name for ref in self.flow.get_attachments()] + list(SAMPLES)
            return stay(UNKNOWN_FILE.format(name=json.dumps(args.name), names=json.dumps(names)))
        self.save_state({"fileName": ref.name})
        message = HumanMessageEx(self, with_files(ATTACHED.format(name=ref.name), [ref]))
        # Re-entering the current step fires no hooks: the model is called again with the file in front of it.
        return go(ExtractInvoiceStep).with_message(message)

    @tool
    async def capture_json(self, args: CaptureJson) -> Transition:
        """Submit the extracted invoice, shaped like the example."""
        if not self.get_state("fileName"):
            return stay(FETCH_FIRST)
        record = as_record(args.record)
        self.save_state({"json": record})
        return finish(record).with_content_type(JSON)

    def find_file(self, name: str) -> FileRef | None:
        """A file of this request (by its name) or one the server holds; the name is never used as a path."""
        for ref in self.flow.get_attachments():
            if ref.name == name:
                return ref
        sample = SAMPLES.get(name)
        return self.flow.attach_server_file(sample) if sample is not None else None


def requested_file(step: Step) -> str | None:
    """The file the request names (``config.fileName``), else the first file attached to it."""
    named = step.get_context("config.fileName")
    if isinstance(named, str) and named.strip():
        return named.strip()
    attached = step.flow.get_attachments()
    return attached[0].name if attached else None
