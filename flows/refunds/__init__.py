"""RefundFlow, the post-purchase support example: verify an order, take a return, refund it once.

The refund is an effect tool: it moves money outside the session, so a retried turn replays its journaled
outcome instead of refunding again, and the payments ledger it calls is handed the call's idempotency key.
``conversation.json`` is a scripted case for the offline demo and tests.
"""

from __future__ import annotations

from flows.refunds.flow import RefundFlow

__all__ = ["RefundFlow"]
