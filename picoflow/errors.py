"""Typed errors raised by PicoFlow; each carries a stable ``code`` and an HTTP ``status_code``."""

from __future__ import annotations

from typing import Any


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

    def __init__(
        self, operation: str, session_id: str | None, reason: str, *, status_code: int = 500, ambiguous: bool = False
    ) -> None:
        super().__init__(
            f"Session store {operation} failed for session '{session_id or ''}': {reason}",
            status_code=status_code,
        )
        self.operation = operation
        self.session_id = session_id
        #: The request may have reached the backend (e.g. a read timeout): a write may have landed.
        self.ambiguous = ambiguous


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


class SessionNotFoundError(PicoFlowError):
    """No session with this id is visible to the caller (it does not exist, or belongs to someone else)."""

    code = "SESSION_NOT_FOUND"
    status_code = 404


class BadRequestError(PicoFlowError):
    """The request itself is malformed; its message is a fixed sentence safe to show the client."""

    code = "BAD_REQUEST"
    status_code = 400


class FlowNotFoundError(PicoFlowError):
    code = "FLOW_NOT_FOUND"
    status_code = 400


class TurnDeadlineError(PicoFlowError):
    """The turn ran out of time before it could start another model call."""

    code = "TURN_DEADLINE"
    status_code = 504


class LlmBlockedError(PicoFlowError):
    """The provider refused or filtered the model call and no hook handled it."""

    code = "LLM_BLOCKED"
    status_code = 422

    def __init__(self, context: Any) -> None:
        super().__init__(
            f"The model provider blocked the {context.phase} of step '{context.step_id}' ({context.reason})."
        )
        #: The ``LlmBlockedContext`` the hooks saw.
        self.context = context


class DecisionValidationError(PicoFlowError):
    """A provider's answers do not fit the questions; they never reach ``on_decision`` and are not retried."""

    code = "DECISION_INVALID"
    status_code = 502

    def __init__(self, message: str, *, usage: Any = None) -> None:
        super().__init__(message)
        #: What the rejected response cost (a ``TokenUsage``), so it is still accounted for.
        self.usage = usage


class ParallelExecutionError(PicoFlowError):
    """A framework failure of a run_steps() barrier: it raises and publishes none of the batch's state."""

    code = "PARALLEL_EXECUTION"


class ParallelMutationError(ParallelExecutionError):
    """A worker tried to change something outside its own private state and memory."""

    code = "PARALLEL_MUTATION"


class ParallelStateConflictError(ParallelExecutionError):
    """Two branches proposed replacements for the same state field (or replaced a reduced one)."""

    code = "PARALLEL_STATE_CONFLICT"


class ParallelDuplicateKeyError(ParallelExecutionError):
    """Two requests of one batch share a branch key."""

    code = "PARALLEL_DUPLICATE_KEY"


class ParallelCancelledError(PicoFlowError):
    """A branch stopped (or never started) because its batch was cancelled; an ordinary rejection."""

    code = "PARALLEL_CANCELLED"


class SessionOutcomeUnknownError(PicoFlowError):
    """A session write was sent but its outcome could not be learnt in time; retry with the same key."""

    code = "SESSION_OUTCOME_UNKNOWN"
    status_code = 503


class ModelUnavailableError(PicoFlowError):
    """A model call failed after its attempts (provider error, timeout, throttling); the session is kept."""

    code = "MODEL_UNAVAILABLE"
    status_code = 502


class ModelNotConfiguredError(PicoFlowError):
    """The deployment cannot reach a model: a provider without its key, an unreadable key parameter, a provider
    that is not registered or a model its provider does not know. The operator's to fix: nothing is written."""

    code = "MODEL_NOT_CONFIGURED"
    status_code = 503

    def __init__(self, message: str, *, provider: str, setting: str) -> None:
        super().__init__(message)
        #: The provider the selection named.
        self.provider = provider
        #: The name (never the value) of the setting to fix: a variable, a parameter or the model name.
        self.setting = setting


class ModelAuthFailedError(ModelNotConfiguredError):
    """The model provider rejected the deployment's credentials (HTTP 401 or 403: a revoked, rotated or mistyped
    key, or access the key or role lacks). The operator's to fix, like any configuration error: nothing is written."""

    code = "MODEL_AUTH_FAILED"
    status_code = 503


class FlowSetupError(PicoFlowError):
    """The flow could not be built for this turn (constructor, ``init``, steps or model configuration)."""

    code = "FLOW_SETUP_FAILED"
    status_code = 500


class RestoreFailedError(PicoFlowError):
    """``on_restore_session_doc`` raised; the stored document is left exactly as it was."""

    code = "RESTORE_FAILED"
    status_code = 500


class IdempotencyKeyMismatchError(PicoFlowError):
    """An ``Idempotency-Key`` already applied to another request body."""

    code = "IDEMPOTENCY_KEY_MISMATCH"
    status_code = 422


class IdempotencyKeyReusedError(PicoFlowError):
    """An ``Idempotency-Key`` whose first turn is too old to replay."""

    code = "IDEMPOTENCY_KEY_REUSED"
    status_code = 422


class IdempotencyKeyTooWeakError(PicoFlowError):
    """An anonymous first turn's ``Idempotency-Key`` is too short to be unique to its client."""

    code = "IDEMPOTENCY_KEY_TOO_WEAK"
    status_code = 400


class CompactionError(PicoFlowError):
    """The summary model produced no usable summary."""

    code = "MEMORY_COMPACTION_FAILED"
    status_code = 500


class ScriptExhaustedError(PicoFlowError):
    """A scripted model has no reply for a model call: its script (``PICOFLOW_SCRIPT``, a test's replies) is
    shorter than the conversation. The turn fails as a model that did not answer (``MODEL_UNAVAILABLE``, the
    session kept); its log line names ``PICOFLOW_SCRIPT`` as the setting and carries this message (the call's
    number, purpose and step, in our own words)."""

    code = "MODEL_UNAVAILABLE"
    status_code = 502


class ScriptedModelError(RuntimeError):
    """The failure a scripted reply with an ``"error"`` entry raises in place of answering.

    ``status_code`` is the HTTP status it stands for (the reply's ``"status"``, 503 by default: a transient
    server failure, which ``should_retry_llm_error``'s default retries; 401 or 400 are not retried).
    """

    def __init__(self, message: str | None = None, status_code: int = 503) -> None:
        super().__init__(message)
        self.status_code = status_code


class FileRefusedError(PicoFlowError):
    """A file, or a turn's files, refused before anything is stored; ``code`` says why (see ``PUBLIC_MESSAGES``)."""

    code = "FILE_REFUSED"
    status_code = 400


class FileStoreError(PicoFlowError):
    """The file store failed or did not answer in time; nothing was attached."""

    code = "FILE_STORE_ERROR"
    status_code = 503


class ApprovalNotPendingError(PicoFlowError):
    """A decision names a call that is not waiting for one: unknown, expired or already decided."""

    code = "APPROVAL_NOT_PENDING"
    status_code = 409


class NotApproverError(PicoFlowError):
    """A decision by someone who may not make it (a user deciding a reviewer's call, or a reviewer their own)."""

    code = "NOT_APPROVER"
    status_code = 403


class IllegalConversationError(ValueError):
    """A request whose messages the Chat Completions API would refuse."""


# The one sentence a client reads for each failure code. Exception text, upstream bodies, paths and
# endpoints never reach a response: they go to the logs and to the session's ``error`` array.
PUBLIC_MESSAGES: dict[str, str] = {
    "BAD_REQUEST": "The request is not valid.",
    "FLOW_NOT_FOUND": "The flow named in flowName is not registered.",
    "SESSION_CONFLICT": "The session was changed by another request at the same time; please retry.",
    "SESSION_NOT_FOUND": "No such session.",
    "SESSION_FLOW_MISMATCH": "This session belongs to another flow; start a new session for this one.",
    "SESSION_FLOW_INVARIANT": "The stored session cannot be read; start a new session.",
    "SESSION_TOO_LARGE": "The session has grown too large to be saved.",
    "SESSION_STORE_ERROR": "The session store is unavailable right now; please retry.",
    "SESSION_OUTCOME_UNKNOWN": (
        "The turn's outcome could not be confirmed; a retry with the same Idempotency-Key is safe and tells it."
    ),
    "TURN_DEADLINE": "The turn ran out of time; the session is unchanged, please retry.",
    "MODEL_UNAVAILABLE": "The model service failed to answer; the session is unchanged, please retry.",
    "MODEL_TIMEOUT": "The model service did not answer in time; the session is unchanged, please retry.",
    "MODEL_THROTTLED": "The model service is busy; the session is unchanged, please retry shortly.",
    "MCP_UNAVAILABLE": "A tool service the flow depends on is unavailable; the session is unchanged, please retry.",
    "MODEL_NOT_CONFIGURED": "The model service is not configured on this server; the session is unchanged.",
    "MODEL_AUTH_FAILED": "The model service refused this server's credentials; the session is unchanged.",
    "LLM_BLOCKED": "The model service refused this request.",
    "TURN_FAILED": "The flow failed while handling this turn.",
    "FLOW_SETUP_FAILED": "The flow could not be started; the session is unchanged.",
    "RESTORE_FAILED": "The session could not be restored; it is kept unchanged.",
    "IDEMPOTENCY_KEY_MISMATCH": "This Idempotency-Key was already used with a different request body.",
    "IDEMPOTENCY_KEY_TOO_WEAK": (
        "Without a signed-in user, a first turn's Idempotency-Key must have at least 32 characters "
        "(e.g. a random UUID), so that no other client can share it."
    ),
    "IDEMPOTENCY_KEY_REUSED": "This Idempotency-Key was already used and can no longer be replayed; use a new key.",
    "MESSAGE_TOO_LARGE": "The message is longer than this API accepts.",
    "FILES_DISABLED": "This API does not accept files.",
    "FILE_NOT_FOUND": "No such file: it does not exist, has expired or belongs to someone else.",
    "FILE_TOO_LARGE": "The file is larger than this API accepts.",
    "FILES_TOO_LARGE": "The files of this turn together are larger than this API accepts.",
    "TOO_MANY_FILES": "The turn carries more files than this API accepts.",
    "FILE_TYPE_NOT_ALLOWED": "This type of file is not accepted.",
    "FILE_CONTENT_MISMATCH": "The file's content does not match its declared type or size.",
    "FILE_DATA_INVALID": "An inline file's data must be base64.",
    "FILE_TYPE_UNSUPPORTED": "The model of this step cannot read this type of file; the session is unchanged.",
    "FILE_STORE_ERROR": "The file store is unavailable right now; please retry.",
    "APPROVAL_NOT_PENDING": "No such call is waiting for a decision: it is unknown, expired or already decided.",
    "NOT_APPROVER": "This call must be decided by someone else.",
    "NOT_FOUND": "No such route.",
    "UNAUTHENTICATED": "This request needs a signed-in caller.",
    "INTERNAL_ERROR": "Internal error.",
}
GENERIC_MESSAGE = "The turn failed."

# The sentence for each code whose usual sentence promises an unchanged session, used instead when this
# request had already saved the session (a restore hook's migration, a checkpoint) before it failed.
SAVED_MESSAGES: dict[str, str] = {
    "TURN_DEADLINE": "The turn ran out of time; changes made earlier in this request were saved, please retry.",
    "MODEL_UNAVAILABLE": (
        "The model service failed to answer; changes made earlier in this request were saved, please retry."
    ),
    "MODEL_TIMEOUT": (
        "The model service did not answer in time; changes made earlier in this request were saved, please retry."
    ),
    "MODEL_THROTTLED": (
        "The model service is busy; changes made earlier in this request were saved, please retry shortly."
    ),
    "MCP_UNAVAILABLE": (
        "A tool service the flow depends on is unavailable; changes made earlier in this request were saved, "
        "please retry."
    ),
    "FILE_TYPE_UNSUPPORTED": (
        "The model of this step cannot read this type of file; changes made earlier in this request were saved."
    ),
    "MODEL_NOT_CONFIGURED": (
        "The model service is not configured on this server; changes made earlier in this request were saved."
    ),
    "MODEL_AUTH_FAILED": (
        "The model service refused this server's credentials; changes made earlier in this request were saved."
    ),
}

# Seconds a client should wait before retrying each retryable code.
RETRY_AFTER_SECONDS: dict[str, int] = {
    "SESSION_CONFLICT": 1,
    "SESSION_STORE_ERROR": 2,
    "FILE_STORE_ERROR": 2,
    "SESSION_OUTCOME_UNKNOWN": 2,
    "TURN_DEADLINE": 2,
    "MODEL_UNAVAILABLE": 5,
    "MODEL_TIMEOUT": 5,
    "MODEL_THROTTLED": 10,
    "MCP_UNAVAILABLE": 5,
    # An operator's fix (a key parameter created or rotated) is picked up within the parameter cache's max age.
    "MODEL_NOT_CONFIGURED": 60,
    "MODEL_AUTH_FAILED": 60,
}


def public_message(code: str | None, *, saved: bool = False) -> str:
    """The fixed sentence a response carries for ``code``; ``saved`` when the request saved the session first."""
    if saved and code in SAVED_MESSAGES:
        return SAVED_MESSAGES[code]
    return PUBLIC_MESSAGES.get(code or "", GENERIC_MESSAGE)
