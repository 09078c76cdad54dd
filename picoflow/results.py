"""The result of one turn, as ``FlowEngine.run`` returns it, and the failure answer for each error."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from picoflow.errors import (
    RETRY_AFTER_SECONDS,
    BadRequestError,
    ModelNotConfiguredError,
    PicoFlowError,
    ScriptExhaustedError,
    SessionOutcomeUnknownError,
    SessionStoreError,
    public_message,
)
from picoflow.logger import library_log
from picoflow.session.document import TokenUsage
from picoflow.wire import PLAIN_TEXT


class RunResponse(BaseModel):
    """The result of one turn; failures carry ``error_code`` and ``status_code``."""

    success: bool
    completed: bool
    message: Any = ""
    session: str = ""
    content_type: str = PLAIN_TEXT
    error_code: str | None = None
    status_code: int = 200
    #: Identifies the request in the logs; failure envelopes carry it so an operator can find the details.
    request_id: str = ""
    #: True when this is the stored answer of a turn already applied under the same ``Idempotency-Key``.
    replayed: bool = False
    #: Seconds a client should wait before retrying a retryable failure.
    retry_after: int | None = None
    #: Tool calls waiting for a person's decision after this turn: ``id``, ``tool``, ``arguments``, ``step``,
    #: ``approver`` ("user" or "reviewer") and ``expires_at`` (ISO-8601 UTC).
    pending_approvals: list[dict[str, Any]] = Field(default_factory=list)
    #: Tokens this turn used (model calls, retries and summaries), for metrics; not part of the envelope.
    tokens: TokenUsage | None = None
    #: What went wrong, for in-process callers and tests; never sent to a client nor kept in a receipt.
    detail: str | None = Field(default=None, repr=False)

    def envelope(self) -> dict[str, Any]:
        """The JSON body returned over HTTP."""
        body: dict[str, Any] = {
            "success": self.success,
            "completed": self.completed,
            "message": self.message,
            "session": self.session,
        }
        if self.success:
            body["contentType"] = self.content_type
            if self.pending_approvals:
                body["pendingApprovals"] = [wire_approval(item) for item in self.pending_approvals]
        else:
            body["code"] = self.error_code
            body["requestId"] = self.request_id
        return body

    def receipt_response(self) -> dict[str, Any]:
        """What a receipt keeps of this response, to answer a retry of the same key identically."""
        return self.model_dump(exclude={"replayed", "retry_after", "tokens", "detail"})

    @classmethod
    def failure(
        cls, exc: PicoFlowError, session: str, request_id: str, *, cause: BaseException | None = None,
        saved: bool = False,
    ) -> RunResponse:
        """The answer for ``exc``, logged with its code and origin; ``saved`` when the request saved the session
        before failing. The message is the code's fixed sentence: exception text stays in the logs."""
        cause = cause or exc.__cause__ or exc
        extra: dict[str, Any] = {
            "requestId": request_id,
            "code": exc.code,
            "statusCode": exc.status_code,
            "errorType": type(cause).__name__,
            "where": _origin(cause),
        }
        if isinstance(exc, ModelNotConfiguredError):
            # Names only: which provider, and which setting (a variable or parameter name) the operator must set.
            extra["provider"] = exc.provider
            extra["setting"] = exc.setting
        if isinstance(cause, ScriptExhaustedError):
            # Our own wording (call number, purpose, step): which reply the script lacks, and the setting
            # that holds the script.
            extra["setting"] = SCRIPT_SETTING
            extra["detail"] = str(cause)
        if isinstance(exc, SessionStoreError | SessionOutcomeUnknownError):
            # Our own wording: operation, endpoint and backend code, never user text.
            extra["detail"] = exc.message
        (library_log.error if exc.status_code >= 500 else library_log.info)("Turn failed", extra=extra)
        return cls(
            success=False,
            completed=False,
            message=client_message(exc, saved=saved),
            session=session,
            error_code=exc.code,
            status_code=exc.status_code,
            request_id=request_id,
            retry_after=RETRY_AFTER_SECONDS.get(exc.code) if exc.status_code >= 409 else None,
            detail=exc.message,
        )


def wire_approval(item: dict[str, Any]) -> dict[str, Any]:
    """A pending approval as the HTTP envelope carries it (``expiresAt``)."""
    return {
        "id": item.get("id"), "tool": item.get("tool"), "arguments": item.get("arguments"), "step": item.get("step"),
        "approver": item.get("approver"), "expiresAt": item.get("expires_at"),
    }


#: The setting a scripted model's replies come from (``picoflow.models.factory`` reads it).
SCRIPT_SETTING = "PICOFLOW_SCRIPT"


def client_message(exc: PicoFlowError, *, saved: bool = False) -> str:
    """What a client is told of ``exc``: request checks speak their own fixed sentences, the rest their code's."""
    return exc.message if isinstance(exc, BadRequestError) else public_message(exc.code, saved=saved)


def _origin(exc: BaseException) -> str | None:
    """``file:line`` where ``exc`` was raised, for the logs (its message may quote user data)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else None
