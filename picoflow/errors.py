"""Typed errors raised by PicoFlow; each carries a stable ``code`` and an HTTP ``status_code``."""

from __future__ import annotations


class PicoFlowError(Exception):
    """Base class of every PicoFlow error."""

    code: str = "PICOFLOW_ERROR"
    status_code: int = 500

    def __init__(self, message: str, *, code: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status_code is not None:
            self.status_code = status_code


class SessionConflictError(PicoFlowError):
    """The stored revision moved on (or the document vanished) since it was read."""

    code = "SESSION_CONFLICT"
    status_code = 409

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session '{session_id}' was changed or removed by another request.")
        self.session_id = session_id


class SessionFlowMismatchError(PicoFlowError):
    """A session id was reused with a flow other than the one it is bound to."""

    code = "SESSION_FLOW_MISMATCH"
    status_code = 409

    def __init__(self, session_id: str, stored_flow: str, requested_flow: str) -> None:
        super().__init__(
            f"Session '{session_id}' belongs to flow '{stored_flow}', not '{requested_flow}'. "
            "Start a new session for that flow."
        )
        self.session_id = session_id
        self.stored_flow = stored_flow
        self.requested_flow = requested_flow


class SessionFlowInvariantError(PicoFlowError):
    """The document is not the singular one-flow shape.

    Also raised for a stored item that cannot be read back at all (corrupted bytes, invalid JSON, a
    missing document attribute, a legacy document holding several flows). The engine answers such a turn
    with 409 and never writes over the item, so it stays exactly as found for inspection.
    """

    code = "SESSION_FLOW_INVARIANT"
    status_code = 409


class SessionStoreError(PicoFlowError):
    """A backend operation failed; carries the operation and the session id."""

    code = "SESSION_STORE_ERROR"
    status_code = 500

    def __init__(self, operation: str, session_id: str | None, reason: str, *, status_code: int = 500) -> None:
        super().__init__(
            f"Session store {operation} failed for session '{session_id or ''}': {reason}",
            status_code=status_code,
        )
        self.operation = operation
        self.session_id = session_id


class SessionTooLargeError(PicoFlowError):
    """The encoded document does not fit in one stored item."""

    code = "SESSION_TOO_LARGE"
    status_code = 413

    def __init__(self, session_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"Session '{session_id}' is {size} bytes when stored, over the {limit} byte limit."
        )
        self.session_id = session_id
        self.size = size
        self.limit = limit
