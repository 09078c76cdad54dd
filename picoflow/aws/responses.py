"""The HTTP API's answers: the JSON envelope (its documented shape too), and a turn's result as a response.

Every failure is the envelope with ``success: false``, a ``code``, the fixed sentence for that code and the
request id; only a well-formed session id is ever echoed, in the body and the ``CHAT_SESSION_ID`` header.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler import Response
from pydantic import BaseModel, Field

from picoflow import RunResponse
from picoflow.aws.idempotency import retry_headers
from picoflow.errors import RETRY_AFTER_SECONDS, public_message
from picoflow.lifecycle import SESSION_ID_PATTERN
from picoflow.wire import JSON, PLAIN_TEXT, RETRY_AFTER_HEADER, SESSION_HEADER


# The sentences of the codes only this adapter answers; the engine's codes have theirs in picoflow.errors.
class PendingApproval(BaseModel):
    """A tool call waiting for a person's decision, as a turn's envelope lists it."""

    id: str
    tool: str
    arguments: Any
    step: str
    approver: str = Field(description="user (the session's user decides) or reviewer.")
    expires_at: str = Field(alias="expiresAt", description="ISO-8601 UTC; undecided by then, the call is declined.")


class TurnEnvelope(BaseModel):
    """The answer of ``POST /ai/run`` (and of every failure)."""

    success: bool
    completed: bool
    message: Any = Field(description="The reply on success, the reason on failure.")
    session: str
    content_type: str | None = Field(default=None, alias="contentType", description="Present on success.")
    code: str | None = Field(default=None, description="Present on failure, e.g. SESSION_CONFLICT.")
    request_id: str | None = Field(default=None, alias="requestId", description="Present on failure.")
    pending_approvals: list[PendingApproval] | None = Field(
        default=None, alias="pendingApprovals", description="Present on success while tool calls wait for a decision."
    )


class WaitingReview(PendingApproval):
    """A tool call waiting for a reviewer, with the session and flow it waits in."""

    session: str
    flow_name: str = Field(alias="flowName")
    created_at: str = Field(alias="createdAt")


class ReviewList(BaseModel):
    """The answer of ``GET /ai/approvals``."""

    approvals: list[WaitingReview]


class EndEnvelope(BaseModel):
    """The answer of ``POST /ai/end``."""

    success: bool
    session: str
    message: str | None = Field(default=None, description="Present on failure.")
    code: str | None = Field(default=None, description="Present on failure.")


def echoable(session: str | None) -> str:
    """``session`` if it is a well-formed id, else "": anything else could smuggle junk into a header."""
    return session if session and SESSION_ID_PATTERN.fullmatch(session) else ""


def envelope(status_code: int, body: Any, session: str = "", headers: dict[str, str] | None = None) -> Response[str]:
    """A JSON response naming ``session`` (when there is one) in the ``CHAT_SESSION_ID`` header."""
    headers = {**(headers or {}), **({SESSION_HEADER: session} if session else {})}
    return Response(status_code=status_code, content_type=JSON, body=json.dumps(body), headers=headers)


def outcome_unknown(request_id: str, session_id: str | None) -> RunResponse:
    """The answer when the handler stops waiting for a turn whose save may still be under way."""
    code = "SESSION_OUTCOME_UNKNOWN"
    return RunResponse(
        success=False, completed=False, message=public_message(code), session=session_id or "", error_code=code,
        status_code=503, request_id=request_id, retry_after=RETRY_AFTER_SECONDS[code],
    )


def failure_body(code: str, session: str, request_id: str, message: str | None = None) -> dict[str, Any]:
    """The failure envelope; ``message`` defaults to the code's fixed sentence."""
    return {
        "success": False, "completed": False, "message": message or public_message(code), "session": session,
        "code": code, "requestId": request_id,
    }


def failure(
    status_code: int,
    code: str,
    session: str,
    request_id: str,
    headers: dict[str, str] | None = None,
    *,
    message: str | None = None,
) -> Response[str]:
    """A failure response for a request that names ``session`` (echoed only when well-formed)."""
    session = echoable(session)
    return envelope(status_code, failure_body(code, session, request_id, message), session, headers)


def unavailable(code: str, session: str, request_id: str) -> Response[str]:
    """A 503 failure of ``code`` (a store that failed or ran out of time), telling the client when to retry."""
    return failure(503, code, session, request_id, {RETRY_AFTER_HEADER: str(RETRY_AFTER_SECONDS[code])})


def turn_response(result: RunResponse) -> Response[str]:
    """The response of a turn: the envelope, or a non-plain step's raw message with its content type."""
    headers = retry_headers(result)
    if not result.success:
        status = result.status_code if 400 <= result.status_code <= 599 else 500
        return envelope(status, result.envelope(), result.session, headers)
    if result.content_type != PLAIN_TEXT:
        body = result.message if isinstance(result.message, str) else json.dumps(result.message)
        headers[SESSION_HEADER] = result.session
        return Response(status_code=200, content_type=result.content_type, body=body, headers=headers)
    return envelope(200, result.envelope(), result.session, headers)
