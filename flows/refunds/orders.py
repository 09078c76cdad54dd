"""The support desk's order book and return policy: code decides eligibility and money, never the model."""

from __future__ import annotations

from dataclasses import dataclass

#: Share of the price kept on a non-defective electronics return.
RESTOCKING_FEE = 0.15


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    price: float
    category: str
    final_sale: bool = False


@dataclass(frozen=True)
class Order:
    order_id: str
    zip_code: str
    items: tuple[Item, ...]


ORDERS = {
    "A1001": Order("A1001", "97201", (
        Item("HP-200", "Wireless headphones", 89.0, "electronics"),
        Item("CS-10", "Headphone case", 19.5, "accessories", final_sale=True),
    )),
    "A1002": Order("A1002", "10001", (Item("KB-7", "Mechanical keyboard", 129.0, "electronics"),)),
}

#: The reasons a return may give; a defect is refunded in full.
REASONS = ("defective", "wrong_item", "changed_mind")


def verified(order_id: str, zip_code: str) -> Order | None:
    """The order when the ZIP code matches it, else None (an unknown order looks the same)."""
    order = ORDERS.get(order_id.strip().upper())
    return order if order is not None and order.zip_code == zip_code.strip() else None


def item(sku: str) -> Item | None:
    """The item with this SKU in any order, or None."""
    wanted = sku.strip().upper()
    return next((item for order in ORDERS.values() for item in order.items if item.sku == wanted), None)


def refund_amount(item: Item, reason: str) -> float | None:
    """What a return of ``item`` for ``reason`` refunds, or None when policy refuses it."""
    if item.final_sale:
        return None
    keep = RESTOCKING_FEE if item.category == "electronics" and reason != "defective" else 0.0
    return round(item.price * (1 - keep), 2)
