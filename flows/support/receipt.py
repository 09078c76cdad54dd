"""Money and refund breakdowns as the customer sees them, rendered by code."""

from __future__ import annotations

from typing import Any


def usd(amount: float) -> str:
    """``$1,234.50``."""
    return f"-${-amount:,.2f}" if amount < 0 else f"${amount:,.2f}"


def quote_table(quote: dict[str, Any]) -> str:
    """A Markdown table of a refund breakdown, ending with the net refund and where it goes."""
    rows = ["| Line | Amount |", "| --- | --- |"]
    rows += [f"| {line['name']} x{line['quantity']} | {usd(line['amount'])} |" for line in quote["lines"]]
    rows.append(f"| Items subtotal | {usd(quote['itemsSubtotal'])} |")
    if quote["restockingFee"]:
        rows.append(f"| Restocking fee | -{usd(quote['restockingFee'])} |")
    if quote["shippingRefund"]:
        rows.append(f"| Shipping refunded | {usd(quote['shippingRefund'])} |")
    rows.append(f"| **Net refund to {quote['refundTarget']}** | **{usd(quote['netRefund'])}** |")
    return "\n".join(rows)
