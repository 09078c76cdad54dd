"""InvoiceFlow: one request in, one invoice record out (``application/json``), the session completed.

``NoToolStep`` answers a small JSON date from its prompt and routes to ``ExtractInvoiceStep`` (memory
``invoice3``, its own model at temperature 0), which fetches the file the request names (``config.fileName``:
a file the server holds, or one uploaded with the request), reads it and captures the record.
"""

from __future__ import annotations

from flows.invoice.steps import ExtractInvoiceStep, NoToolStep
from picoflow import Flow, ModelSelection, Step


class InvoiceFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4.1-mini", retry_attempts=3)

    def define_steps(self) -> list[Step]:
        return [
            NoToolStep(self),
            ExtractInvoiceStep(self)
            .use_memory("invoice3")
            .use_model(ModelSelection(provider="openai", name="gpt-4.1", params={"temperature": 0})),
        ]
