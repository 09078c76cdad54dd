"""RefundFlow, for the effect-timing proofs: its refund tool is an effect that calls the payments service.

The refund handler POSTs to ``PAYMENTS_URL`` with the call's ``tool_idempotency_key()`` as ``Idempotency-Key``.
``crash_at`` names the point where the process running a turn kills itself (SIGKILL, like a crashed container):
``before_handler`` or ``after_downstream`` here; the worker (``effect_worker``) places the other points.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, stay, tool

#: Set by the process running the flow.
PAYMENTS_URL = ""
crash_at: str | None = None
#: Seconds every request to the payments service may take.
PAYMENTS_TIMEOUT_SECONDS = 5


def crash_if(point: str) -> None:
    """Kill this process on the spot when ``point`` is the chosen crash point."""
    if crash_at == point:
        os.kill(os.getpid(), signal.SIGKILL)


class RefundArgs(BaseModel):
    order: str
    amount: float


def post_refund(args: RefundArgs, key: str) -> str:
    request = urllib.request.Request(
        f"{PAYMENTS_URL}/refunds",
        data=json.dumps(args.model_dump()).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=PAYMENTS_TIMEOUT_SECONDS) as response:
        return str(json.loads(response.read())["refund"])


class RefundStep(Step):
    def get_prompt(self) -> str:
        return "Refund orders when asked."

    @tool(effect=True)
    async def refund(self, args: RefundArgs) -> Any:
        """Refund an order."""
        crash_if("before_handler")
        reference = await asyncio.to_thread(post_refund, args, self.tool_idempotency_key())
        crash_if("after_downstream")
        return stay(f"Refunded {args.amount:.2f} on {args.order}: {reference}.")


class RefundFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="refunds", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [RefundStep(self).use_memory("refunds")]


class ApprovedRefundStep(RefundStep):
    """The same refund, decided by the session's user before it runs (``approval=True``)."""

    @tool(effect=True, approval=True)
    async def refund(self, args: RefundArgs) -> Any:
        """Refund an order, once the user approves."""
        crash_if("before_handler")
        reference = await asyncio.to_thread(post_refund, args, self.tool_idempotency_key())
        crash_if("after_downstream")
        return stay(f"Refunded {args.amount:.2f} on {args.order}: {reference}.")


class ApprovedRefundFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="refunds", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [ApprovedRefundStep(self).use_memory("refunds")]
