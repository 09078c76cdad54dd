"""The typed records of InvoiceFlow: the routing decision, the captured invoice and the checked answer."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

from pydantic import BaseModel, Field

CENT = Decimal("0.01")


class Route(BaseModel):
    """What the user asked for, judged from their words and the attached file."""

    task: Literal["extract_invoice", "other"] = Field(
        description="extract_invoice when an invoice is attached and the user wants its data, else other"
    )
    reason: str = Field(description="One short sentence explaining the choice")


class OpenAttachmentArgs(BaseModel):
    """Which attachment to open, by its position in the attachment list."""

    index: int = Field(ge=0, description="0 for the first attachment")


class LineItem(BaseModel):
    description: str
    quantity: float = Field(gt=0)
    unit_price: float = Field(description="Price of one unit")
    amount: float = Field(description="The line's total as printed on the invoice")


class Invoice(BaseModel):
    """The data printed on the invoice, exactly as read (amounts as printed, dates as YYYY-MM-DD)."""

    vendor: str
    invoice_number: str
    invoice_date: str = Field(description="YYYY-MM-DD")
    due_date: str | None = Field(default=None, description="YYYY-MM-DD, when printed")
    currency: str = Field(default="USD", description="ISO 4217 code")
    line_items: list[LineItem] = Field(min_length=1)
    subtotal: float
    tax: float = 0.0
    total: float


class InvoiceRecord(Invoice):
    """The answer: the invoice plus what code found when it redid the arithmetic."""

    arithmetic_ok: bool
    problems: list[str] = Field(default_factory=list)
    file_name: str


def money(value: float) -> Decimal:
    """``value`` as an amount in cents (floats from JSON are rounded to the cent once, here)."""
    return Decimal(str(value)).quantize(CENT, rounding=ROUND_HALF_UP)


def arithmetic_problems(invoice: Invoice) -> list[str]:
    """Where the printed amounts disagree with each other: each line, the subtotal and the total."""
    problems = []
    for number, item in enumerate(invoice.line_items, start=1):
        expected = (money(item.quantity) * money(item.unit_price)).quantize(CENT, rounding=ROUND_HALF_UP)
        if expected != money(item.amount):
            problems.append(f"line {number}: {item.quantity} x {item.unit_price} is {expected}, not {item.amount}")
    lines = sum((money(item.amount) for item in invoice.line_items), Decimal(0))
    if lines != money(invoice.subtotal):
        problems.append(f"the lines add up to {lines}, not the subtotal {invoice.subtotal}")
    if money(invoice.subtotal) + money(invoice.tax) != money(invoice.total):
        problems.append(f"subtotal plus tax is {money(invoice.subtotal) + money(invoice.tax)}, not {invoice.total}")
    return problems
