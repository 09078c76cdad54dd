"""SupportFlow, Northwind Outfitters' post-purchase support demo.

A customer verifies an order (number plus email or ZIP code), asks about it, returns items under the return
policy (refunds above the agent's limit or with a restocking fee wait for the customer's approval, released after
ten minutes), or disputes a charge (a billing ticket is opened in code); the case closes with a recap.
"""

from __future__ import annotations

from flows.support.flow import APPROVAL_HOLD_MS, SESSION_IDLE_MS, SupportFlow

__all__ = ["APPROVAL_HOLD_MS", "SESSION_IDLE_MS", "SupportFlow"]
