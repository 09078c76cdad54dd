"""DeskFlow, the refund desk the approval tests drive: ``refund`` waits for the user's decision above 100,
``payout`` always for a reviewer's, ``note`` runs without anyone. Every handler run is appended to ``APPLIED``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, stay, tool

APPLIED: list[tuple[str, dict[str, Any]]] = []


class Refund(BaseModel):
    order: str
    amount: float


class Note(BaseModel):
    text: str


class DeskStep(Step):
    def get_prompt(self) -> str:
        return "Help with refunds."

    @tool(effect=True, approval=lambda args: args.amount > 100)
    async def refund(self, args: Refund) -> Any:
        """Refund an order."""
        APPLIED.append(("refund", args.model_dump()))
        self.save_state({"refunds": [*(self.get_state("refunds") or []), args.order]})
        return stay(f"Refunded {args.amount:.2f} on {args.order}.")

    @tool(effect=True, approval="reviewer")
    async def payout(self, args: Refund) -> Any:
        """Pay out goodwill credit."""
        APPLIED.append(("payout", args.model_dump()))
        self.save_state({"payouts": [*(self.get_state("payouts") or []), args.order]})
        return stay(f"Paid {args.amount:.2f} on {args.order}.")

    @tool
    async def note(self, args: Note) -> Any:
        """Keep a note."""
        APPLIED.append(("note", args.model_dump()))
        return stay("noted")


class DeskFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="desk", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [DeskStep(self)]
