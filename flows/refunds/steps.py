"""RefundFlow's steps: the triage hub verifies the order and routes; the returns desk refunds an item once."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import HumanMessage
from pydantic import BaseModel, Field

from flows.refunds import orders, payments
from picoflow import Step, TerminateSessionStep, Transition, direct_to, go, prompt, stay, tool
from picoflow.messages import HumanMessageEx


class VerifyOrder(BaseModel):
    order_id: str = Field(description="The order number, e.g. A1001")
    zip_code: str = Field(description="The ZIP code the order was delivered to")


class NoArgs(BaseModel):
    pass


class RefundItem(BaseModel):
    sku: str = Field(description="The SKU of the returned item, as listed")
    reason: Literal["defective", "wrong_item", "changed_mind"]


#: Refunds above this many USD are decided by a reviewer (a second person) instead of the customer.
REVIEW_ABOVE_USD = 100.0


def refund_approver(args: RefundItem) -> bool | str:
    """Who decides a refund before money moves: nobody when policy refunds nothing (the handler says why), the
    customer up to ``REVIEW_ABOVE_USD``, a reviewer above it."""
    item = orders.item(args.sku)
    amount = None if item is None else orders.refund_amount(item, args.reason)
    if amount is None:
        return False
    return "reviewer" if amount > REVIEW_ABOVE_USD else True


class TriageStep(Step):
    """The case hub: owns the verified order and the refunds issued, routes returns, closes the case."""

    def get_prompt(self) -> str:
        return prompt("triage.md", __file__)

    @tool
    async def verify_order(self, args: VerifyOrder) -> Transition:
        """Verify the customer's order with its number and delivery ZIP code."""
        order = orders.verified(args.order_id, args.zip_code)
        if order is None:
            return stay("No order matches that number and ZIP code. Ask the customer to check both.")
        self.save_state({"order": order.order_id})
        return stay(f"Order {order.order_id} verified. Items: {', '.join(item.name for item in order.items)}.")

    @tool
    async def start_return(self, args: NoArgs) -> Transition:
        """Hand a verified order's return to the returns desk."""
        if not self.get_state("order"):
            return stay("Verify the order before starting a return.")
        text = next((m.content for m in reversed(self.get_memory()) if isinstance(m, HumanMessage)), "")
        return go(ReturnsStep).with_message(HumanMessageEx(ReturnsStep.id, str(text)))

    @tool
    async def close_case(self, args: NoArgs) -> Transition:
        """Close the case when the customer has nothing more to ask."""
        refunds = self.get_state("refunds") or []
        recap = "; ".join(f"{r['name']} refunded {r['amount']:.2f} USD ({r['reference']})" for r in refunds)
        return go(TerminateSessionStep).with_prompt(
            "The case is closed. Thank the customer in one or two sentences"
            + (f" and recap exactly this: {recap}." if recap else ".")
        )


class ReturnsStep(Step):
    """Collects the returned item and reason, then refunds it by policy: the amount is computed in code."""

    def order(self) -> orders.Order:
        return orders.ORDERS[self.flow.get_step_state(TriageStep, "order")]

    def get_prompt(self) -> str:
        order = self.order()
        items = "\n".join(f"- {item.sku}: {item.name}, {item.price:.2f} USD" for item in order.items)
        return prompt("returns.md", __file__, order=order.order_id, items=items)

    # A refund moves money outside the session: a person decides it first, bound to these exact arguments, and it
    # runs once, however often the request that settles it is retried.
    @tool(effect=True, approval=refund_approver)
    async def refund_item(self, args: RefundItem) -> Transition:
        """Refund a returned item of the verified order, by the return policy."""
        order = self.order()
        item = next((item for item in order.items if item.sku == args.sku.strip().upper()), None)
        if item is None:
            return stay(f"No item {args.sku} in order {order.order_id}. Ask which listed item is returned.")
        amount = orders.refund_amount(item, args.reason)
        if amount is None:
            return stay(f"{item.name} was a final sale and cannot be refunded. Tell the customer so, politely.")
        # The payments service deduplicates on this key: the same in every retry of this turn.
        reference = payments.issue_refund(order.order_id, item.sku, amount, self.tool_idempotency_key())
        refunds = self.flow.get_step_state(TriageStep, "refunds") or []
        record = {"sku": item.sku, "name": item.name, "amount": amount, "reference": reference}
        self.flow.save_step_state(TriageStep, {"refunds": [*refunds, record]})
        # The refund is a fact, so code words it; the case goes back to the hub.
        return direct_to(
            TriageStep,
            f"Your refund of {amount:.2f} USD for the {item.name} has been issued (reference {reference}). "
            "Is there anything else I can help you with?",
        )
