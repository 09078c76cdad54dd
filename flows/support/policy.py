"""The return policy, decided in code: windows per category, final sale, opened electronics, approval limit.

``adjudicate`` answers ``auto`` (the refund is committed at once), ``review`` (the customer must approve the
exact breakdown first: a restocking fee applies or the refund is above the agent's limit) or ``deny`` (with the
reasons). Amounts are rounded to the cent; the refund goes back to the order's payment method.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, date, datetime
from typing import Any

from flows.support import orders

#: Days after delivery within which a category may be returned.
RETURN_WINDOW_DAYS = {"apparel": 60, "footwear": 60, "gear": 45, "electronics": 30}
#: Above this net refund, the customer approves the breakdown before anything is committed.
AUTO_APPROVAL_LIMIT = 250
#: Share of an opened electronics line kept on return.
RESTOCKING_SHARE = 0.15
#: Reasons for which the order's shipping is refunded too.
SHIPPING_REFUNDED_FOR = ("damaged", "wrong_item")
REASONS = ("damaged", "wrong_item", "too_small", "too_large", "not_as_described", "no_longer_needed")
#: Pins the policy's "today" (an ISO date or instant) for demos and tests.
CURRENT_DATE_VARIABLE = "SUPPORT_FLOW_CURRENT_DATE"


def today(pinned: str | None = None) -> date:
    """``pinned`` (an ISO date or instant) when given, else ``$SUPPORT_FLOW_CURRENT_DATE``, else today's UTC date."""
    value = (pinned or os.environ.get(CURRENT_DATE_VARIABLE, "")).strip()
    return datetime.fromisoformat(value.replace("Z", "+00:00")).date() if value else datetime.now(UTC).date()


def cents(amount: float) -> float:
    """Rounded to the cent, halves up."""
    scaled = amount * 100
    whole = math.floor(scaled)
    return (whole + 1 if scaled - whole >= 0.5 else whole) / 100


def days_since_delivery(order: dict[str, Any], on: date) -> int | None:
    delivered = order["deliveredAt"]
    return None if delivered is None else (on - date.fromisoformat(delivered)).days


def quote(order: dict[str, Any], items: list[dict[str, Any]], reason: str) -> dict[str, Any]:
    """The refund breakdown of returning ``items`` for ``reason``."""
    lines = [{"lineId": item["lineId"], "name": item["name"], "quantity": item["quantity"],
              "amount": cents(item["unitPrice"] * item["quantity"])} for item in items]
    subtotal = cents(sum(line["amount"] for line in lines))
    fee = cents(sum(item["unitPrice"] * item["quantity"] * RESTOCKING_SHARE
                    for item in items if item["category"] == "electronics" and item["opened"]))
    shipping = cents(order["shipping"]["paid"]) if reason in SHIPPING_REFUNDED_FOR else 0
    return {"lines": lines, "itemsSubtotal": subtotal, "restockingFee": fee, "shippingRefund": shipping,
            "netRefund": cents(subtotal - fee + shipping), "refundTarget": orders.payment_method(order)}


def adjudicate(order: dict[str, Any], line_ids: list[str], reason: str, already_returned: list[str],
               on: date | None = None) -> dict[str, Any]:
    """``{"decision": "auto" | "review" | "deny", "reasons": [...], "quote"?: {...}}``."""
    items = orders.line_items(order, line_ids)
    if not items or len(items) != len(line_ids):
        return {"decision": "deny", "reasons": ["One or more line items are not part of this order."]}
    if order["shipping"]["status"] != "delivered":
        return {"decision": "deny",
                "reasons": [f"Order {order['orderId']} has not been delivered yet, so it cannot be returned."]}
    age = days_since_delivery(order, on or today()) or 0
    returned = {line_id.upper() for line_id in already_returned}
    denials = []
    for item in items:
        window = RETURN_WINDOW_DAYS[item["category"]]
        if item["finalSale"]:
            denials.append(f"{item['name']} was a final-sale item and is not returnable.")
        if item["returned"] or item["lineId"].upper() in returned:
            denials.append(f"{item['name']} has already been returned on this order.")
        if age > window:
            denials.append(f"{item['name']} is {age} days past delivery, beyond the {window}-day "
                           f"{item['category']} return window.")
    if denials:
        return {"decision": "deny", "reasons": denials}
    breakdown = quote(order, items, reason)
    reasons = []
    if breakdown["restockingFee"] > 0:
        reasons.append(f"Opened electronics carry a 15% restocking fee of {breakdown['restockingFee']:.2f}.")
    if breakdown["netRefund"] > AUTO_APPROVAL_LIMIT:
        reasons.append(f"The net refund of {breakdown['netRefund']:.2f} exceeds the {AUTO_APPROVAL_LIMIT} "
                       "agent approval limit.")
    if reasons:
        return {"decision": "review", "reasons": reasons, "quote": breakdown}
    return {"decision": "auto", "reasons": ["Inside the standard return window and agent approval limit."],
            "quote": breakdown}
