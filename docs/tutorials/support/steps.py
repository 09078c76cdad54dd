"""The steps of OrderHelpFlow: triage with verification, a returns desk, and the policy decision in code."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field

from picoflow import LogicStep, Step, TerminateSessionStep, Transition, direct_to, finish, go, stay, tool

from .orders import ORDERS, Order, decide_return, find_order

ROLE = "You are the support assistant of a small home-goods shop. Be brief and never promise an outcome."


def today(step: Step) -> date:
    pinned = step.get_context("config.today")
    return date.fromisoformat(pinned) if pinned else date.today()


# --8<-- [start:triage]
class VerifyArgs(BaseModel):
    order_id: str = Field(description="The order number, like A-1001")
    email: str = Field(description="The e-mail address the order was placed with")


class RouteArgs(BaseModel):
    topic: Literal["return", "other"] = Field(description="What the customer needs help with")


class TriageStep(Step):
    """Verify the customer owns the order, then hand the case to the desk that handles it."""

    def get_prompt(self) -> str:
        order = self.get_state("order")
        if order is None:
            return f"{ROLE}\nAsk for the order number and e-mail address, then call verify_order."
        return f"{ROLE}\nOrder {order} is verified. Ask what they need and call route_case."

    @tool
    async def verify_order(self, args: VerifyArgs) -> Transition:
        """Check that the order exists and belongs to this e-mail address."""
        order = find_order(args.order_id, args.email)
        if order is None:
            return stay("No order matches that number and e-mail address. Ask the customer to check both.")
        self.save_state({"order": order.id})
        return stay(f"Verified order {order.id}. Ask what the customer needs help with.")

    @tool
    async def route_case(self, args: RouteArgs) -> Transition:
        """Send the case to the desk for its topic, once the order is verified."""
        if self.get_state("order") is None:
            # However the conversation went, no case moves on without a verified order.
            return stay("The order is not verified yet. Ask for the order number and e-mail address first.")
        if args.topic == "return":
            return go(ReturnsStep)
        return finish("I've passed your question to our team; they will e-mail you within one working day.")

    @tool
    async def terminate_session(self, args: TerminateSessionStep.TerminateArgs) -> Transition:
        return go(TerminateSessionStep).with_prompt(args.prompt)
# --8<-- [end:triage]


# --8<-- [start:returns]
class ReturnArgs(BaseModel):
    line_ids: list[str] = Field(description="The ids of the order lines to return, like L1")
    opened: bool = Field(description="Whether the customer has opened the items")


class ReturnsStep(Step):
    """Collect which lines to return and whether they were opened; the decision is AdjudicateStep's."""

    def get_prompt(self) -> str:
        order = find_order_by_id(self)
        lines = ", ".join(f"{line.id}: {line.item}" for line in order.lines)
        return f"{ROLE}\nThe order's lines are {lines}. Ask which to return and whether they were opened."

    @tool
    async def request_return(self, args: ReturnArgs) -> Transition:
        """Record the lines to return and whether they were opened."""
        known = {line.id for line in find_order_by_id(self).lines}
        unknown = sorted(set(args.line_ids) - known)
        if unknown or not args.line_ids:
            return stay(f"Unknown line ids {unknown}; ask again using the ids listed.")
        return go(AdjudicateStep).with_state({"lines": args.line_ids, "opened": args.opened})


def find_order_by_id(step: Step) -> Order:
    """The order TriageStep verified: later steps read it from there instead of keeping a copy."""
    return ORDERS[step.flow.get_step_state(TriageStep, "order")]
# --8<-- [end:returns]


# --8<-- [start:adjudicate]
class AdjudicateStep(LogicStep):
    """Apply the return policy in code and answer with its exact outcome."""

    async def run_logic(self) -> Transition:
        decision = decide_return(find_order_by_id(self), self.get_state("lines"), self.get_state("opened"), today(self))
        self.save_state({"approved": decision.approved, "refund": decision.refund})
        if decision.approved:
            return finish(f"Your return is approved: ${decision.refund:.2f} will be refunded once we receive it.")
        return direct_to(TriageStep, f"I'm sorry, this return can't be accepted: {decision.reason}.")
# --8<-- [end:adjudicate]
