"""SupportFlow's steps: a front desk, a returns desk, the policy decision, the customer's approval, billing.

The model talks; code verifies orders, applies the return policy, computes every amount and writes every RMA
and ticket. Refund and ticket ids are derived from the case (order, lines or charges), so a retried turn gives
the same id.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, date, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from flows.support import orders, policy, receipt
from picoflow import LogicStep, Step, TerminateSessionStep, Transition, go, stay, tool
from picoflow.authoring.prompts import prompt
from picoflow.messages import HumanMessageEx

Reason = Literal["damaged", "wrong_item", "too_small", "too_large", "not_as_described", "no_longer_needed"]

# Words that name a reason, checked in this order on the customer's latest message.
REASON_WORDS: tuple[tuple[Reason, str], ...] = (
    ("damaged", r"broken|torn|cracked|leaking|defect"),
    ("wrong_item", r"wrong (product|item|color|colour)|not what i ordered"),
    ("too_small", r"too small|too tight|runs small"),
    ("too_large", r"too big|too large|runs big"),
    ("not_as_described", r"not as described|misleading|not advertised"),
    ("no_longer_needed", r"no longer need|changed my mind|bought by mistake|better one"),
)
CHARGE_ID = re.compile(r"\bCH-\d+\b", re.IGNORECASE)


class VerifyArgs(BaseModel):
    orderId: str = Field(min_length=1, description="The order number, e.g. NW-100412")  # noqa: N815
    secret: str = Field(min_length=1, description="The email address or ZIP code the order was placed with")


class RouteArgs(BaseModel):
    department: Literal["returns", "billing"]


class CloseArgs(BaseModel):
    summary: str = Field(min_length=1, description="A short recap of the case for the closing message")


class NoArgs(BaseModel):
    pass


class ReturnArgs(BaseModel):
    lineIds: list[str] = Field(min_length=1, description="Line ids of the returned items, e.g. L2")  # noqa: N815
    reason: Reason
    note: str | None = None


class DoneArgs(BaseModel):
    done: bool


class ConfirmArgs(BaseModel):
    confirmed: bool


class DeclineArgs(BaseModel):
    declined: bool


class DisputeArgs(BaseModel):
    chargeIds: list[str] = Field(min_length=1, description="Charge ids of the order, e.g. CH-88301")  # noqa: N815
    description: str = Field(min_length=1, description="What the customer says is wrong, in a sentence")
    amountInDispute: float = Field(description="The disputed amount as the customer states it")  # noqa: N815


def _instructions(stage_file: str, **values: Any) -> str:
    return f"{prompt('role.md', __file__)}\n\n{prompt(stage_file, __file__, **values)}"


def _digits(text: str, count: int) -> str:
    number = int(hashlib.sha256(text.encode()).hexdigest(), 16) % (9 * 10 ** (count - 1))
    return str(number + 10 ** (count - 1))


def rma_id(order_id: str, line_ids: list[str], reason: str) -> str:
    """``RMA-`` and six digits, derived from the return."""
    lines = ",".join(line_ids)
    return f"RMA-{_digits(f'{order_id}|{lines}|{reason}', 6)}"


def ticket_id(order_id: str, charge_ids: list[str]) -> str:
    """``ESC-`` and five digits, derived from the disputed charges."""
    charges = ",".join(charge_ids)
    return f"ESC-{_digits(f'{order_id}|{charges}', 5)}"


def verified_order(step: Step) -> dict[str, Any]:
    """The order TriageStep verified; raises when a desk runs before verification (a programming error)."""
    order = step.flow.get_step_state(TriageStep, "order")
    if not isinstance(order, dict):
        raise RuntimeError(f"{step.id} requires a verified order from TriageStep.")
    return order


def ledger_order(step: Step) -> dict[str, Any]:
    order = orders.find(verified_order(step)["orderId"])
    if order is None:
        raise RuntimeError("The verified order is no longer in the order book.")
    return order


def latest_customer_text(step: Step) -> str:
    """The newest customer message in the step's history."""
    return next((str(m.content) for m in reversed(step.get_memory()) if m.type == "human"), "")


def case_date(step: Step) -> date:
    """The policy's today: ``config.currentDate``, else ``$SUPPORT_FLOW_CURRENT_DATE``, else the UTC date."""
    return policy.today(step.get_context("config.currentDate"))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TriageStep(Step):
    """The front desk: verifies the order, answers status questions, routes, reports outcomes, closes the case."""

    def get_prompt(self) -> str:
        case = {"refunds": self.get_state("refunds") or [], "tickets": self.get_state("tickets") or []}
        return _instructions(
            "triage.md", TODAY=case_date(self).isoformat(), ORDER=json.dumps(self.get_state("order")),
            CASE=json.dumps(case),
        )

    @tool
    async def verify_order(self, args: VerifyArgs) -> Transition:
        """Verify an order with its email address or ZIP code."""
        order = orders.verify(args.orderId, args.secret)
        if order is None:
            self.save_state({"verifyAttempts": (self.get_state("verifyAttempts") or 0) + 1})
            return stay("That order number and email or ZIP code do not match. Ask the customer to check both.")
        summary = orders.summary(order)
        self.save_state({"order": summary, "verifyAttempts": 0})
        return stay(json.dumps({"accepted": True, "order": summary}))

    @tool
    async def route_request(self, args: RouteArgs) -> Transition:
        """Route a verified request to the returns or the billing desk."""
        if not self.get_state("order"):
            return stay("Verify the order before routing the request.")
        target = ReturnsStep if args.department == "returns" else BillingStep
        # The desk has its own history: hand it the customer's request so they need not repeat it.
        said = latest_customer_text(self)
        return go(target).with_message(HumanMessageEx(target.id, said)) if said else go(target)

    @tool
    async def close_case(self, args: CloseArgs) -> Transition:
        """Close a case that has committed outcomes."""
        refunds, tickets = self.get_state("refunds") or [], self.get_state("tickets") or []
        if not refunds and not tickets:
            return stay("Nothing has been committed on this case yet.")
        outcomes = [f"- {r['rma']}: {receipt.usd(r['netRefund'])} refunded to {r['refundTarget']}." for r in refunds]
        outcomes += [f"- Ticket {t['ticketId']} ({t['category']}) is with the billing team." for t in tickets]
        return go(TerminateSessionStep).with_prompt(
            "\n".join([args.summary.strip(), *outcomes, "Thank the customer for shopping with Northwind Outfitters."])
        )

    @tool
    async def terminate_session(self, args: dict[str, Any]) -> Transition:
        # The tool and its schema are TerminateSessionStep's; the front desk offers it.
        return go(TerminateSessionStep).with_prompt(args["prompt"])


class ReturnsStep(Step):
    """Collects the returned lines and one reason, then hands the request to the policy."""

    def get_prompt(self) -> str:
        order = verified_order(self)
        returned = self.get_state("returnedLineIds") or []
        available = {**order, "lineItems": [item for item in order["lineItems"]
                                            if item["returnable"] and item["lineId"] not in returned]}
        return _instructions(
            "returns.md", ORDER=json.dumps(available), RETURN_POLICY=json.dumps(policy.RETURN_WINDOW_DAYS),
            RETURNED=json.dumps(returned), LAST_DENIAL=json.dumps(self.get_state("lastDenial") or []),
        )

    async def on_response(self, result: Any) -> Any:
        # A customer message that already names the items and a reason is submitted even if the model only talked.
        request = self._inferred_request()
        if request is not None:
            return self._adjudicate(request)
        selected = self._inferred_lines()
        if selected:
            self.save_state({"pendingLineIds": selected})
        return await super().on_response(result)

    @tool
    async def request_return(self, args: ReturnArgs) -> Transition:
        """Submit the chosen order line ids and one return reason for the policy decision."""
        order = verified_order(self)
        returned = [line_id.upper() for line_id in self.get_state("returnedLineIds") or []]
        selected = list(dict.fromkeys(line_id.strip().upper() for line_id in args.lineIds))
        known = {item["lineId"].upper() for item in order["lineItems"]}
        unknown = [line_id for line_id in selected if line_id not in known]
        if unknown:
            return stay(f"These line items are not on order {order['orderId']}: {', '.join(unknown)}.")
        repeated = [line_id for line_id in selected if line_id in returned]
        if repeated:
            return stay(f"These line items were already returned during this conversation: {', '.join(repeated)}.")
        request = {"orderId": order["orderId"], "lineIds": selected, "reason": args.reason}
        if args.note and args.note.strip():
            request["note"] = args.note.strip()
        return self._adjudicate(request)

    @tool
    async def end_return_request(self, args: DoneArgs) -> Transition:
        """Go back to the front desk."""
        request = self._inferred_request()
        if request is not None:
            return self._adjudicate(request)
        return go(TriageStep) if args.done else stay()

    def _adjudicate(self, request: dict[str, Any]) -> Transition:
        self.remove_state("pendingLineIds")
        self.save_state({"lastDenial": []})
        return go(AdjudicateStep).with_state({"request": request})

    def _inferred_request(self) -> dict[str, Any] | None:
        reason, lines = self._inferred_reason(), self._inferred_lines()
        if reason is None or not lines:
            return None
        return {"orderId": verified_order(self)["orderId"], "lineIds": lines, "reason": reason}

    def _inferred_lines(self) -> list[str]:
        items, text = verified_order(self)["lineItems"], latest_customer_text(self)
        named = [item["lineId"] for item in items if re.search(rf"\b{re.escape(item['lineId'])}\b", text, re.I)]
        if named:
            return named
        words = set(re.findall(r"[a-z0-9]+", text.lower()))
        # An item is meant when two of its longer name words are in the message.
        by_name = [item["lineId"] for item in items
                   if sum(1 for w in re.findall(r"[a-z0-9]+", item["name"].lower()) if len(w) >= 4 and w in words) >= 2]
        return by_name or list(self.get_state("pendingLineIds") or [])

    def _inferred_reason(self) -> Reason | None:
        text = latest_customer_text(self).lower()
        return next((reason for reason, words in REASON_WORDS if re.search(words, text)), None)


class AdjudicateStep(LogicStep):
    """Applies the return policy without a model: commits a refund, asks for approval, or explains a refusal."""

    async def run_logic(self) -> Transition:
        request = self.get_state("request")
        if not isinstance(request, dict):
            raise RuntimeError("AdjudicateStep requires a return request.")
        order = orders.find(request["orderId"])
        if order is None:
            raise RuntimeError("AdjudicateStep cannot load the order of the request.")
        returned = list(self.flow.get_step_state(ReturnsStep, "returnedLineIds") or [])
        decision = policy.adjudicate(order, request["lineIds"], request["reason"], returned, case_date(self))
        self.save_state({"decision": decision["decision"], "adjudication": decision})
        if decision["decision"] == "deny":
            return go(ReturnsStep).with_state({"lastDenial": decision["reasons"]})
        if decision["decision"] == "review":
            pending = {"request": request, "quote": decision["quote"], "reasons": decision["reasons"]}
            return go(ApprovalStep).with_state({"pending": pending})
        refunds = commit_refund(self, request, decision["quote"], "agent")
        return go(TriageStep).with_state({"refunds": refunds})


def commit_refund(step: Step, request: dict[str, Any], quote: dict[str, Any], authority: str) -> list[dict[str, Any]]:
    """Record the refund of ``request`` and mark its lines returned; the case's refunds, this one last."""
    refund = {"rma": rma_id(request["orderId"], request["lineIds"], request["reason"]), "orderId": request["orderId"],
              "lineIds": request["lineIds"], "netRefund": quote["netRefund"], "refundTarget": quote["refundTarget"],
              "authority": authority}
    returned = list(step.flow.get_step_state(ReturnsStep, "returnedLineIds") or [])
    step.flow.save_step_state(ReturnsStep, {"returnedLineIds": [*returned, *request["lineIds"]]})
    return [*(step.flow.get_step_state(TriageStep, "refunds") or []), refund]


class ApprovalStep(Step):
    """Holds a refund that needs the customer's yes: shows the exact breakdown and commits only on a clear yes."""

    #: The stage instructions: here the model reads the customer's yes from their words.
    instructions = "approval.md"

    def _pending(self) -> dict[str, Any]:
        pending = self.get_state("pending")
        if not isinstance(pending, dict):
            raise RuntimeError("ApprovalStep requires a pending refund.")
        return pending

    def get_prompt(self) -> str:
        pending = self._pending()
        request = pending["request"]
        summary = {"orderId": request["orderId"], "lineIds": request["lineIds"], "reason": request["reason"],
                   "reasons": pending["reasons"]}
        breakdown = receipt.quote_table(pending["quote"])
        return _instructions(self.instructions, PENDING=json.dumps(summary), BREAKDOWN=breakdown)

    @tool
    async def confirm_refund(self, args: ConfirmArgs) -> Transition:
        """Commit the exact pending refund after the customer's clear confirmation."""
        if not args.confirmed:
            return stay("Only an explicit confirmation commits this refund.")
        pending = self._pending()
        refunds = commit_refund(self, pending["request"], pending["quote"], "customer_confirmed")
        self.flow.save_step_state(TriageStep, {"refunds": refunds})
        self.remove_state("pending")
        self.save_state({"decidedAt": now_iso()})
        return go(TriageStep)

    @tool
    async def decline_refund(self, args: DeclineArgs) -> Transition:
        """Drop the pending refund and go back to the returns desk."""
        if not args.declined:
            return stay()
        self.remove_state("pending")
        self.save_state({"decidedAt": now_iso()})
        return go(ReturnsStep).with_state({"lastDenial": []})


class DecidedApprovalStep(ApprovalStep):
    """The same hold, decided by the customer through the framework's approval (config ``approvals: true``):
    ``confirm_refund`` waits for the customer's Approve or Deny, bound to these exact arguments and recorded, instead
    of committing on the model's reading of a "yes"."""

    id = ApprovalStep.id
    instructions = "approval_decided.md"

    # The same ten minutes as the flow's hold: an undecided refund counts as declined.
    @tool(effect=True, approval=True, approval_ttl=600)
    async def confirm_refund(self, args: ConfirmArgs) -> Transition:
        """Put the exact pending refund to the customer, who approves or declines it; it commits once approved."""
        return await super().confirm_refund(args)


class BillingStep(Step):
    """Records a billing dispute on the order's charges; never issues a credit."""

    def get_prompt(self) -> str:
        order = ledger_order(self)
        facts = {"orderId": order["orderId"], "placedAt": order["placedAt"], "paymentMethod": order["paymentMethod"]}
        return _instructions(
            "billing.md", ORDER=json.dumps(facts), CHARGES=json.dumps(order["charges"]),
            DUPLICATES=json.dumps(orders.duplicate_charges(order)),
        )

    async def on_response(self, result: Any) -> Any:
        # A customer message naming charges of the order is a dispute, whatever the model made of it.
        dispute = self._inferred_dispute()
        if dispute is not None:
            return self._escalate(dispute)
        return await super().on_response(result)

    @tool
    async def open_dispute(self, args: DisputeArgs) -> Transition:
        """Record the disputed charges of the order and open a billing ticket."""
        order = ledger_order(self)
        ledger = {charge["chargeId"].upper(): charge for charge in order["charges"]}
        ids = list(dict.fromkeys(charge_id.strip().upper() for charge_id in args.chargeIds))
        unknown = [charge_id for charge_id in ids if charge_id not in ledger]
        if unknown:
            return stay(f"These charges are not on order {order['orderId']}: {', '.join(unknown)}.")
        amount = policy.cents(sum(ledger[charge_id]["amount"] for charge_id in ids))
        dispute = {"orderId": order["orderId"], "chargeIds": ids, "description": args.description.strip(),
                   "amountInDispute": amount}
        feedback = ("Dispute accepted." if policy.cents(args.amountInDispute) == amount
                    else f"The disputed total was corrected to {receipt.usd(amount)} from the order's charges.")
        return self._escalate(dispute).with_tool_feedback(feedback)

    @tool
    async def end_billing_request(self, args: DoneArgs) -> Transition:
        """Go back to the front desk."""
        dispute = self._inferred_dispute()
        if dispute is not None:
            return self._escalate(dispute)
        return go(TriageStep) if args.done else stay()

    def _escalate(self, dispute: dict[str, Any]) -> Transition:
        self.save_state({"dispute": dispute})
        return go(EscalateStep).with_state({"dispute": dispute})

    def _inferred_dispute(self) -> dict[str, Any] | None:
        text, order = latest_customer_text(self), ledger_order(self)
        ledger = {charge["chargeId"].upper(): charge for charge in order["charges"]}
        ids = list(dict.fromkeys(match.upper() for match in CHARGE_ID.findall(text)))
        if not ids or any(charge_id not in ledger for charge_id in ids):
            return None
        amount = policy.cents(sum(ledger[charge_id]["amount"] for charge_id in ids))
        return {"orderId": order["orderId"], "chargeIds": ids, "description": text.strip(), "amountInDispute": amount}


class EscalateStep(LogicStep):
    """Writes the billing ticket in code, so every accepted dispute has one before the front desk speaks again."""

    async def run_logic(self) -> Transition:
        dispute = self.get_state("dispute")
        if not isinstance(dispute, dict):
            raise RuntimeError("EscalateStep requires a captured dispute.")
        order = orders.find(dispute["orderId"])
        if order is None:
            raise RuntimeError("EscalateStep cannot load the order of the dispute.")
        charges = [charge for charge in order["charges"] if charge["chargeId"].upper() in dispute["chargeIds"]]
        duplicate = len(charges) > 1 and len({charge["amount"] for charge in charges}) < len(charges)
        amount = dispute["amountInDispute"]
        facts = ", ".join(f"{c['chargeId']} on {c['postedAt']} for {c['amount']:.2f}" for c in charges)
        ticket = {
            "ticketId": ticket_id(order["orderId"], dispute["chargeIds"]),
            "category": "duplicate_charge" if duplicate else "wrong_amount",
            "summary": f"Order {order['orderId']} has a billing dispute for {facts}. "
                       f"Customer reported: {dispute['description']}",
            "customerImpact": "high" if amount > 250 else "medium" if amount >= 50 else "low",
            "requestedRemedy": "Review the disputed charge(s) and determine the appropriate billing correction "
                               f"for order {order['orderId']}.",
            "amountInDispute": amount,
            "openedAt": now_iso(),
        }
        self.save_state({"ticket": ticket})
        tickets = self.flow.get_step_state(TriageStep, "tickets") or []
        return go(TriageStep).with_state({"tickets": [*tickets, ticket]})
