"""InvoiceFlow, the one-shot example: a named invoice (a PDF or image the server holds, or an uploaded one)
becomes a JSON record.

``conversation.json`` scripts an extraction of the server-held ``sample_invoice.pdf`` (two pages) for the
offline demo, ``scenario.json`` and ``judge_script.json`` evaluate it, and ``invoice_example.json`` is both
the prompt's example and the record that sample holds.
"""

from __future__ import annotations

from flows.invoice.flow import InvoiceFlow

__all__ = ["InvoiceFlow"]
