"""Northwind Outfitters' order book: six demo orders, read-only; every outcome of a case lives in the session."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("orders.json")


@cache
def orders() -> tuple[dict[str, Any], ...]:
    """The orders, read once per process."""
    return tuple(json.loads(DATA.read_text(encoding="utf-8")))


def find(order_id: str) -> dict[str, Any] | None:
    """The order with this number (case and surrounding spaces ignored)."""
    wanted = order_id.strip().upper()
    return next((order for order in orders() if order["orderId"].upper() == wanted), None)


def verify(order_id: str, secret: str) -> dict[str, Any] | None:
    """The order when ``secret`` is its email address or its ZIP code; None otherwise, unknown orders included."""
    order = find(order_id)
    candidate = secret.strip().lower()
    if order is None or candidate not in (order["email"].lower(), order["postalCode"].lower()):
        return None
    return order


def line_items(order: dict[str, Any], line_ids: list[str]) -> list[dict[str, Any]]:
    """The order's lines with these ids, in the order asked; unknown ids are skipped."""
    by_id = {item["lineId"].upper(): item for item in order["lineItems"]}
    return [by_id[key] for key in (line_id.strip().upper() for line_id in line_ids) if key in by_id]


def duplicate_charges(order: dict[str, Any]) -> list[dict[str, Any]]:
    """Charges whose amount appears more than once on the order."""
    amounts = [charge["amount"] for charge in order["charges"]]
    return [charge for charge in order["charges"] if amounts.count(charge["amount"]) > 1]


def summary(order: dict[str, Any]) -> dict[str, Any]:
    """What a verified customer may be told about an order (no postal code)."""
    return {
        "orderId": order["orderId"], "customerName": order["customerName"], "email": order["email"],
        "placedAt": order["placedAt"], "deliveredAt": order["deliveredAt"],
        "shippingStatus": order["shipping"]["status"], "carrier": order["shipping"]["carrier"],
        "tracking": order["shipping"]["tracking"], "paymentMethod": payment_method(order),
        "lineItems": [
            {"lineId": item["lineId"], "name": item["name"], "category": item["category"],
             "quantity": item["quantity"], "unitPrice": item["unitPrice"], "opened": item["opened"],
             "finalSale": item["finalSale"], "returnable": not item["finalSale"] and not item["returned"]}
            for item in order["lineItems"]
        ],
    }


def payment_method(order: dict[str, Any]) -> str:
    """``Visa ending 4021``: where a refund goes."""
    return f"{order['paymentMethod']['brand']} ending {order['paymentMethod']['last4']}"
