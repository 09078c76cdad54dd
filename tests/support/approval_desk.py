"""A refund desk whose refunds the user approves and whose goodwill credits a reviewer approves, for the tests of
the chat page's approval cards and the inspector's approvals panel (loaded through ``PICOFLOW_FLOWS``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from picoflow import Flow, ModelSelection, Step, stay, tool

#: The memory namespace the step writes to.
NAMESPACE = "desk"


class Refund(BaseModel):
    order: str = Field(description="The order number.")
    amount: float = Field(description="The amount to pay back.")


class DeskStep(Step):
    def get_prompt(self) -> str:
        return "Help with refunds. Each refund waits for the customer's approval."

    @tool(effect=True, approval=True)
    async def refund(self, args: Refund) -> Any:
        """Refund an order to the customer's card."""
        self.save_state({"refunds": [*(self.get_state("refunds") or []), args.order]})
        return stay(f"Refunded {args.amount:.2f} on {args.order}.")

    @tool(effect=True, approval="reviewer")
    async def goodwill(self, args: Refund) -> Any:
        """Pay goodwill credit on an order."""
        self.save_state({"credits": [*(self.get_state("credits") or []), args.order]})
        return stay(f"Credited {args.amount:.2f} on {args.order}.")


class DeskFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [DeskStep(self).use_memory(NAMESPACE)]
