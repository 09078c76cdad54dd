"""InvoiceFlow, the one-shot example: an uploaded invoice (image or PDF) becomes a checked JSON record.

``conversation.json`` and ``sample_invoice.png`` are a scripted extraction for the offline demo and tests.
"""

from __future__ import annotations

from flows.invoice.flow import InvoiceFlow

__all__ = ["InvoiceFlow"]
