"""The calls a person decides, as a session keeps them: the decisions a request carries, expiry, the record of
who decided what, and the claim a deciding request holds on a call while it settles it.

The records themselves are ``ApprovalDoc`` entries of ``SessionDoc.approvals``; the turn pauses calls and settles
decided ones (``picoflow.turn.approvals``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from picoflow.deadline import current_deadline
from picoflow.errors import ApprovalNotPendingError, BadRequestError, NotApproverError, SessionConflictError
from picoflow.session.document import ApprovalCall, ApprovalDoc, SessionDoc, format_timestamp, utc_now
from picoflow.session.journal import canonical_json

#: The reason an expired call is recorded with.
EXPIRED_REASON = "expired"
#: Decided calls kept in the document for the record (who, when, reason) besides the pending ones.
KEPT_DECIDED = 50
#: How long a decision's claim on its call lasts when the request has no deadline: long enough to run the tool.
CLAIM_SECONDS = 60.0
#: How long a claim outlives its request's deadline: room for the clocks of two hosts to differ.
CLAIM_MARGIN_SECONDS = 2.0
#: The longest reason a decision may carry.
MAX_REASON_CHARS = 500

@dataclass(frozen=True)
class Decision:
    """One decision as a request gives it: the approval's id, the verdict, and an optional reason."""

    id: str
    approved: bool
    reason: str | None = None


def decisions_from(raw: Any) -> tuple[Decision, ...]:
    """The checked ``approvals`` of a request (a list of ``{"id", "approved", "reason"?}``); ``BadRequestError``
    for anything else."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise BadRequestError("approvals must be a list of decisions.")
    decisions: list[Decision] = []
    for item in raw:
        if isinstance(item, Decision):
            decisions.append(item)
            continue
        if not isinstance(item, Mapping):
            raise BadRequestError("Each decision must be an object with id and approved.")
        approval_id, approved, reason = item.get("id"), item.get("approved"), item.get("reason")
        if not isinstance(approval_id, str) or not approval_id or len(approval_id) > 64:
            raise BadRequestError("A decision's id must be a non-empty string.")
        if not isinstance(approved, bool):
            raise BadRequestError("A decision's approved must be true or false.")
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
            raise BadRequestError(f"A decision's reason must be a string of at most {MAX_REASON_CHARS} characters.")
        decisions.append(Decision(approval_id, approved, reason.strip() or None if reason else None))
    if len({decision.id for decision in decisions}) != len(decisions):
        raise BadRequestError("A request may decide each call once.")
    return tuple(decisions)


def public(approval: ApprovalDoc) -> dict[str, Any]:
    """A pending call as ``RunResponse.pending_approvals`` lists it."""
    return {
        "id": approval.id,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "step": approval.step,
        "approver": approval.approver,
        "expires_at": format_timestamp(approval.expires_at),
    }


def pending(doc: SessionDoc) -> list[dict[str, Any]]:
    """The calls of ``doc`` waiting for a decision, oldest first, as the turn's response lists them."""
    return [public(approval) for approval in doc.approvals if approval.status == "pending"]


def arguments_digest(step_id: str, calls: Sequence[ApprovalCall]) -> str:
    """SHA-256 over the step and the canonical JSON of the calls: what a decision is bound to."""
    body = canonical_json([step_id, [[call.name, call.args] for call in calls]])
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def expire(doc: SessionDoc) -> list[ApprovalDoc]:
    """Mark the pending calls whose time ran out as expired (declined); they are settled like denied ones."""
    moment = utc_now()
    expired = [a for a in doc.approvals if a.status == "pending" and a.expires_at <= moment]
    for approval in expired:
        approval.status, approval.decided_at, approval.reason = "expired", moment, EXPIRED_REASON
    return expired


def decide(doc: SessionDoc, decisions: Iterable[Decision], *, approver: str, decided_by: str | None,
           owner: str | None = None) -> list[ApprovalDoc]:
    """Record ``decisions`` on the pending calls they name, as ``approver`` ("user" or "reviewer") and
    ``decided_by`` (the principal). Nothing is changed unless every decision may be taken.

    The same decision again on a call it decided whose request failed before settling it is that decision's
    retry: it is taken up once that request's claim has lapsed (``SessionConflictError``, retryable, before).

    Raises ``ApprovalNotPendingError`` for a call that is unknown, expired or decided, ``NotApproverError`` for a
    call someone else must decide (a user deciding a reviewer's call, a reviewer deciding the call of their own
    session).
    """
    by_id = {approval.id: approval for approval in doc.approvals}
    chosen: list[tuple[ApprovalDoc, Decision]] = []
    retried: list[ApprovalDoc] = []
    for decision in decisions:
        approval = by_id.get(decision.id)
        if approval is not None and _retry_of(approval, decision, decided_by):
            if not lapsed([approval]):
                raise SessionConflictError(doc.id)
            retried.append(approval)
            continue
        if approval is None or approval.status != "pending":
            raise ApprovalNotPendingError("The call is not waiting for a decision.")
        if approval.approver != approver:
            raise NotApproverError(f"The call must be decided by its {approval.approver}.")
        if approver == "reviewer" and decided_by is not None and decided_by == owner:
            raise NotApproverError("A reviewer cannot decide a call of their own session.")
        chosen.append((approval, decision))
    now = utc_now()
    for approval, decision in chosen:
        approval.status = "approved" if decision.approved else "denied"
        approval.decided_at, approval.decided_by, approval.reason = now, decided_by, decision.reason
    return [approval for approval, _ in chosen] + retried


def _retry_of(approval: ApprovalDoc, decision: Decision, decided_by: str | None) -> bool:
    """Whether ``decision`` repeats the one recorded on ``approval`` that was never settled."""
    verdict = "approved" if decision.approved else "denied"
    return (not approval.settled and approval.status == verdict and approval.decided_by == decided_by
            and approval.reason == decision.reason)


def claim(approvals: Iterable[ApprovalDoc]) -> None:
    """Claim decided calls for this request until it can have settled them (the claim is written with the
    decision, so a request that sees a live claim leaves the call to its claimant)."""
    deadline = current_deadline()
    seconds = CLAIM_SECONDS if deadline is None else max(deadline - time.monotonic(), 0.0) + CLAIM_MARGIN_SECONDS
    until = utc_now() + timedelta(seconds=seconds)
    for approval in approvals:
        approval.claimed_until = until


def unsettled(doc: SessionDoc) -> list[ApprovalDoc]:
    """Decided calls whose outcome the model has not read yet, oldest first."""
    return [a for a in doc.approvals if a.status != "pending" and not a.settled]


def lapsed(approvals: Iterable[ApprovalDoc]) -> list[ApprovalDoc]:
    """Those of ``approvals`` no live claim holds: their claimant finished, failed or never existed."""
    now = utc_now()
    return [a for a in approvals if a.claimed_until is None or a.claimed_until <= now]




def forget_old(doc: SessionDoc) -> None:
    """Keep the newest ``KEPT_DECIDED`` settled calls: the record stays readable without growing forever."""
    settled = [a for a in doc.approvals if a.settled]
    if len(settled) > KEPT_DECIDED:
        dropped = {id(a) for a in settled[: len(settled) - KEPT_DECIDED]}
        doc.approvals = [a for a in doc.approvals if id(a) not in dropped]


def review_entries(doc: SessionDoc) -> list[dict[str, Any]]:
    """The calls of ``doc`` waiting for a reviewer, as reviewers list them (``SessionStore.list_reviews``)."""
    return [
        {**public(approval), "session": doc.id, "flowName": doc.flow.name,
         "createdAt": format_timestamp(approval.created_at)}
        for approval in doc.approvals if approval.status == "pending" and approval.approver == "reviewer"
    ]


def still_waiting(entries: Iterable[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """``entries`` not yet expired, oldest first, at most ``limit``."""
    now = format_timestamp(utc_now())
    waiting = [entry for entry in entries if str(entry.get("expires_at", "")) > now]
    return sorted(waiting, key=lambda entry: str(entry.get("createdAt", "")))[:limit]
