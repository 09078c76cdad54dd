"""The steps of InvoiceFlow; the file bytes never enter the session, only references to them."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import BaseMessage

from flows.invoice.records import Invoice, InvoiceRecord, OpenAttachmentArgs, Route, arithmetic_problems
from picoflow import Step, Transition, finish, go, stay, tool
from picoflow.files.refs import FileRef, with_files
from picoflow.messages import HumanMessageEx
from picoflow.prompts import prompt
from picoflow.wire import JSON

OPENER = "Extract the invoice I attached."
ATTACHED_TEXT = (
    "The invoice '{name}' is attached to this message. Read it from the attachment and call capture_invoice; "
    "do not open it again."
)
RECHECK = (
    "The amounts you captured do not add up ({problems}). Read the invoice again and capture exactly what is "
    "printed."
)
NOT_AN_INVOICE = "Attach an invoice (an image or a PDF) and ask for its data."


def _listing(refs: list[FileRef]) -> str:
    return json.dumps([{"index": i, "name": ref.name, "type": ref.content_type} for i, ref in enumerate(refs)])


def attachments(step: Step) -> list[FileRef]:
    """The attachments the routing step handed over (references kept in the extraction step's state)."""
    return [FileRef.model_validate(item) for item in step.flow.get_step_state(ExtractInvoiceStep, "attachments") or []]


class RouteStep(Step):
    """Routes without tools: the model returns a small ``Route`` record and code decides what it may do."""

    def get_prompt(self) -> str:
        return prompt("route.md", __file__, ATTACHMENTS=_listing(self.flow.get_attachments()) or "none")

    def struct_output_schema(self) -> type[Route]:
        return Route

    async def on_response(self, result: Any) -> Any:
        refs = self.flow.get_attachments()
        if not isinstance(result, Route) or result.task != "extract_invoice" or not refs:
            self.flow.mark_completed()
            self.content_type = JSON
            return json.dumps({"error": NOT_AN_INVOICE})
        handover = [ref.model_dump(by_alias=True) for ref in refs]
        return go(ExtractInvoiceStep).with_state({"attachments": handover})


class ExtractInvoiceStep(Step):
    """Opens the invoice by re-entering itself with a message carrying the file, then captures it."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, OPENER)

    def get_prompt(self) -> str:
        return prompt("extract.md", __file__, ATTACHMENTS=_listing(attachments(self)))

    @tool
    async def open_attachment(self, args: OpenAttachmentArgs) -> Transition:
        """Attach one of the request's files to the conversation so you can read it."""
        refs = attachments(self)
        # The model picks by position among the request's own attachments: no name or path is ever looked up.
        if args.index >= len(refs):
            return stay(f"There is no attachment {args.index}; the attachments are {_listing(refs)}.")
        ref = refs[args.index]
        message = HumanMessageEx(self, with_files(ATTACHED_TEXT.format(name=ref.name), [ref]))
        self.save_state({"opened": ref.name})
        return go(ExtractInvoiceStep).with_message(message)

    @tool
    async def capture_invoice(self, args: Invoice) -> Transition:
        """Capture the invoice exactly as printed."""
        problems = arithmetic_problems(args)
        if problems and not self.get_state("rechecked"):
            # One more reading is worth it when the amounts disagree; after that the record says so.
            self.save_state({"rechecked": True})
            return stay(RECHECK.format(problems="; ".join(problems)))
        record = InvoiceRecord(
            **args.model_dump(), arithmetic_ok=not problems, problems=problems, file_name=self.get_state("opened") or ""
        )
        self.save_state({"invoice": record.model_dump(mode="json")})
        return finish(record.model_dump(mode="json")).with_content_type(JSON)
