"""The result of one turn, as ``FlowEngine.run`` returns it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

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
        else:
            body["code"] = self.error_code
            body["requestId"] = self.request_id
        return body

    def receipt_response(self) -> dict[str, Any]:
        """What a receipt keeps of this response, to answer a retry of the same key identically."""
        return self.model_dump(exclude={"replayed", "retry_after", "tokens", "detail"})
