"""Tool calls a person decides, in the turn: pausing a call instead of running it, and settling decided calls.

A call of an approval tool (``@tool(effect=True, approval=...)``) does not run when the model makes it: it waits in
the session document (``SessionDoc.approvals``) with its validated arguments and their digest, and the turn ends.
A decision marks the stored call approved or denied and is written at once, by the session's conditional write,
before anything runs: of two decisions racing for one call, only the one whose write lands goes on. The decided
call is then *settled*: an approved call runs through the effect journal under a key derived from the approval's
id (so a retry in any later request replays it instead of running it again), a denied or expired one never runs;
either way the model reads the outcome as the result of a tool call, and the call is marked settled.

A decided call whose settling was cut short (a crash after the decision's write) is taken over by the next request
on the session once its claim has lapsed, so no decision is lost and none runs twice.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from langchain_core.messages import BaseMessage

from picoflow.authoring.flow import Flow
from picoflow.authoring.step import Step
from picoflow.authoring.step_tools import ApprovalRule
from picoflow.messages import AiMessageEx, ToolMessageEx, gen_message_id
from picoflow.session.approvals import arguments_digest, forget_old
from picoflow.session.document import ApprovalCall, ApprovalDoc, utc_now

#: What the model reads while a call waits, and once it is declined or has expired.
WAITING = (
    "Not run yet: this call waits for {who}'s decision (approval {id}). Tell the user it is waiting for that "
    "decision; do not call the tool again for it."
)
DECLINED = "The {who} declined this call; it did not run."
DECLINED_WITH_REASON = "The {who} declined this call; it did not run. Their reason: {reason}"
EXPIRED = "No decision was made in time, so this call was declined; it did not run."
#: The reason recorded on an approved call whose stored arguments no longer match what was decided.
TAMPERED_REASON = "the arguments changed after the decision"


# -- pausing ------------------------------------------------------------------------------------


def pause(flow: Flow, step: Step, rule: ApprovalRule, argument: Any, calls: Sequence[Mapping[str, Any]], *,
          group: bool = False) -> list[ToolMessageEx] | None:
    """Keep ``calls`` (validated, as their handler would get them) waiting for a person's decision when ``rule``
    asks for one on ``argument`` (what the handler would get); the tool results the model reads meanwhile, one per
    call, or None when the calls may run now."""
    waiting = rule.waiting(argument)
    if waiting is None:
        return None
    approver, ttl = waiting
    doc = flow.run_context.require_doc()
    now = utc_now()
    stored = [ApprovalCall(name=call["name"], args=call.get("args") or {}) for call in calls]
    approval = ApprovalDoc(
        id=f"ap_{secrets.token_hex(8)}", step=step.id, namespace=step.namespace, calls=stored, group=group,
        digest=arguments_digest(step.id, stored), approver=approver, created_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    doc.approvals.append(approval)
    flow.logger.log("approval pending", step=step.id, tool=approval.tool, approval=approval.id,
                    approver=approver)
    who = "the user" if approver == "user" else "a reviewer"
    text = WAITING.format(who=who, id=approval.id)
    return [ToolMessageEx(step.id, text, call.get("id") or "", name=call["name"], status="success") for call in calls]


# -- settling -----------------------------------------------------------------------------------

#: Runs the calls of one approved approval on its step: ``(step, AI message, journal key) -> tool outcome``.
RunApproved = Callable[[Step, AiMessageEx, str], Awaitable[tuple[list[BaseMessage], BaseMessage | None, bool]]]


async def settle(flow: Flow, approvals: Sequence[ApprovalDoc], run: RunApproved) -> tuple[BaseMessage | None, bool]:
    """Deliver each decided call's outcome into its step's memory (running the approved ones through ``run``);
    the direct message a handler answered with, if any, and whether it finishes the session."""
    answer: tuple[BaseMessage | None, bool] = (None, False)
    for approval in approvals:
        step = flow.require_step(approval.step)
        calls = [{"name": call.name, "args": call.args, "id": f"{approval.id}_{index}", "type": "tool_call"}
                 for index, call in enumerate(approval.calls)]
        ai = AiMessageEx(step.id, "", tool_calls=calls)
        ai.id = gen_message_id(step.id)
        if approval.status == "approved" and approval.digest != arguments_digest(approval.step, approval.calls):
            # The stored arguments are not the ones decided on: the call never runs.
            flow.logger.error("approval arguments changed", step=step.id, tool=approval.tool, approval=approval.id)
            approval.status, approval.reason = "denied", TAMPERED_REASON
        if approval.status == "approved":
            messages, extra, finish = await run(step, ai, journal_key(flow, approval))
            if extra is not None:
                answer = (extra, finish)
        else:
            text = _declined(approval)
            messages = [ToolMessageEx(step.id, text, call["id"], name=call["name"], status="error") for call in calls]
        flow.run_context.view(flow).memory().namespace(approval.namespace).messages.extend([ai, *messages])
        approval.settled, approval.claimed_until = True, None
        flow.logger.log("approval settled", step=step.id, tool=approval.tool, approval=approval.id,
                        status=approval.status)
    forget_old(flow.run_context.require_doc())
    return answer


def journal_key(flow: Flow, approval: ApprovalDoc) -> str:
    """The effect journal key of an approved call: its session and approval id, the same in every request."""
    session = flow.run_context.require_doc().id
    return hashlib.sha256(f"picoflow-approval\x1f{session}\x1f{approval.id}".encode()).hexdigest()[:32]


def _declined(approval: ApprovalDoc) -> str:
    if approval.status == "expired":
        return EXPIRED
    who = "user" if approval.approver == "user" else "reviewer"
    if approval.reason:
        return DECLINED_WITH_REASON.format(who=who, reason=approval.reason)
    return DECLINED.format(who=who)
