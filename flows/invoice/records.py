"""The invoice record InvoiceFlow captures: the shape of ``invoice_example.json``, as a schema.

The example in the prompt shows the model what a good record looks like; this schema refuses a record that
lacks what callers rely on (vendor, bill number, currency, line items, total and balance due). Values the
invoice does not print may be left out and are stored as null.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Part(BaseModel):
    # Keys the schema does not name are kept: the record is what the model read, never silently trimmed.
    model_config = ConfigDict(extra="allow")


class BankAccount(_Part):
    banking_account: str | None = None
    banking_routing: str | None = None
    swift: str | None = None


class BankingInfo(_Part):
    banking_institution: str | None = None
    wire: BankAccount | None = None
    ach: BankAccount | None = None


class Address(_Part):
    company_name: str | None = None
    address_line_1: str | None = None
    address_line_2: str | None = None
    city: str | None = None
    state: str | None = None
    zip: int | str | None = None


class InvoiceItem(_Part):
    spec_tag: str | None = None
    description: str
    quantity: float
    overage: float | None = None
    units: str | None = None
    unit_price: float
    discount: float | None = None
    extended_price: float
    fob: str | None = None


class Invoice(_Part):
    """An invoice as printed: dates YYYY-MM-DD, amounts and rates as plain numbers, the tax rate a fraction."""

    vendor_name: str
    vendor_id: str | None = None
    bill_number: str
    bill_date: str | None = None
    due_date: str | None = None
    ship_date: str | None = None
    po_number: str | None = None
    po_id: str | None = None
    vendor_order_number: str | None = None
    account_number: str | None = None
    payment_terms: str | None = None
    banking_info: BankingInfo | None = None
    payment_instructions: str | None = None
    notes: str | None = None
    currency: str = Field(description="ISO 4217 code, e.g. USD")
    bill_to_address: Address | None = None
    ship_to_address: Address | None = None
    invoice_items: list[InvoiceItem] = Field(min_length=1)
    subtotal: float | None = None
    packing_fee: float | None = None
    freight: float | None = None
    sales_tax: float | None = None
    sales_tax_rate: float | None = None
    total: float
    prepayment: float | None = None
    balance_due: float


class CaptureJson(BaseModel):
    """The arguments of ``capture_json``: the record under ``json``. A field of that name would shadow
    ``BaseModel.json``, so the field has another name and the alias: the model is shown ``json``."""

    record: Invoice = Field(alias="json", description="The extracted invoice, shaped like the example")


class FetchFile(BaseModel):
    """The arguments of ``fetch_file``."""

    name: str = Field(description="Name of the file to attach, as the instructions give it")


def as_record(invoice: Invoice) -> dict[str, Any]:
    """The record as stored in state and answered to the caller (JSON types, unknown keys kept)."""
    return invoice.model_dump(mode="json")
