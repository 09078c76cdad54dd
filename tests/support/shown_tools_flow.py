"""Flows whose model calls read-only tools and an effect tool, for what AG-UI shows of tool calls.

``DeskFlow`` shows its read-only tools' calls (``show_tool_calls``), except the one that says ``show=False``, and not
its effect tool's, whose arguments hold a card number; ``QuietDeskFlow`` is the same desk with the default, showing
no call's arguments; ``ReceiptDeskFlow`` opts its effect tool in with ``@tool(effect=True, show=True)``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, stay, tool

#: The card number the booking tool receives, which no client may see.
CARD = "4111 1111 1111 1111"


class RoomQuery(BaseModel):
    city: str
    nights: int


class Booking(BaseModel):
    room: str
    card_number: str


class GuestQuery(BaseModel):
    name: str


class Receipt(BaseModel):
    booking: str


class DeskStep(Step):
    def get_prompt(self) -> str:
        return "Find and book rooms."

    @tool
    async def find_rooms(self, args: RoomQuery) -> Any:
        """Find free rooms in a city."""
        return stay(f"Room 12 in {args.city} is free for {args.nights} nights.")

    @tool(show=False)
    async def find_guest(self, args: GuestQuery) -> Any:
        """Find a guest's phone number."""
        return stay(f"{args.name} is on +351 912 345 678.")

    @tool(effect=True)
    async def book_room(self, args: Booking) -> Any:
        """Book a room, paying with a card."""
        return stay(f"Booked {args.room}, paid with the card ending {args.card_number[-4:]}.")


class ReceiptStep(DeskStep):
    @tool(effect=True, show=True)
    async def send_receipt(self, args: Receipt) -> Any:
        """Email the receipt of a booking."""
        return stay(f"Receipt of {args.booking} sent.")


class DeskFlow(Flow):
    """Finds and books rooms."""

    show_tool_calls = True

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [DeskStep(self)]


class QuietDeskFlow(DeskFlow):
    """Finds and books rooms, showing no tool call's arguments."""

    show_tool_calls = False


class ReceiptDeskFlow(Flow):
    """Books rooms and sends receipts, showing only the receipts' calls."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [ReceiptStep(self)]
