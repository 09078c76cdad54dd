"""InvoiceFlow: one request in, one JSON record out.

``RouteStep`` (a step without tools) decides from the user's words and the attachment whether this is an
extraction; ``ExtractInvoiceStep`` opens the chosen attachment by re-entering itself with a message that
carries the file, captures the invoice into a typed record, redoes the arithmetic in code and answers the
record raw as ``application/json``, completing the session.
"""

from __future__ import annotations

from flows.invoice.steps import ExtractInvoiceStep, RouteStep
from picoflow import Flow, ModelSelection, Step


class InvoiceFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4.1-mini", params={"temperature": 0})

    def define_steps(self) -> list[Step]:
        return [RouteStep(self).use_memory("route"), ExtractInvoiceStep(self).use_memory("invoice")]
