"""The order book and the return policy of the support tutorial: plain code, the only authority on facts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

#: Days after delivery within which an unopened item may be returned.
RETURN_WINDOW_DAYS = 30


@dataclass(frozen=True)
class Line:
    id: str
    item: str
    price: float


@dataclass(frozen=True)
class Order:
    id: str
    email: str
    delivered: date
    lines: tuple[Line, ...]


ORDERS = {
    "A-1001": Order("A-1001", "ada@example.com", date(2026, 2, 20), (
        Line("L1", "Walnut desk lamp", 89.0),
        Line("L2", "Linen lampshade", 24.5),
    )),
    "A-0950": Order("A-0950", "ada@example.com", date(2025, 11, 2), (Line("L1", "Wool throw", 120.0),)),
}


def find_order(order_id: str, email: str) -> Order | None:
    """The order, when the e-mail address is the one it was placed with; None otherwise (never say which)."""
    order = ORDERS.get(order_id.strip().upper())
    return order if order is not None and order.email == email.strip().lower() else None


@dataclass(frozen=True)
class ReturnDecision:
    approved: bool
    refund: float
    reason: str


def decide_return(order: Order, line_ids: list[str], opened: bool, today: date) -> ReturnDecision:
    """The return policy: unopened items, within the window after delivery, refunded at the price paid."""
    lines = [line for line in order.lines if line.id in line_ids]
    if (today - order.delivered).days > RETURN_WINDOW_DAYS:
        return ReturnDecision(False, 0.0, f"the {RETURN_WINDOW_DAYS}-day return window has closed")
    if opened:
        return ReturnDecision(False, 0.0, "opened items cannot be returned")
    return ReturnDecision(True, round(sum(line.price for line in lines), 2), "within the policy")
