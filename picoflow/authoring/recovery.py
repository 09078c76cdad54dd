"""Recovery values of a model call: its code-owned policy, which errors are transient, the hook contexts and a
fallback model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

from picoflow.errors import PicoFlowError
from picoflow.models.registry import ModelSelection

if TYPE_CHECKING:
    from picoflow.authoring.step_runs import CancellationSignal


LlmErrorKind = Literal["invocation_error", "empty_response", "response_rejected"]
StopReason = Literal["retry_declined", "attempts_exhausted"]


# Statuses that say "try again later"; any other 4xx is the request's own fault and is never repeated.
TRANSIENT_STATUSES = frozenset({408, 425, 429})
# Names of throttling and transport failures across the SDKs (OpenAI-style clients, httpx, botocore, Google).
TRANSIENT_ERROR_NAMES = frozenset(
    {
        "APIConnectionError", "APITimeoutError", "RateLimitError", "InternalServerError", "ServiceUnavailableError",
        "ConnectError", "ConnectTimeout", "ReadTimeout", "ReadError", "RemoteProtocolError", "PoolTimeout",
        "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
        "ThrottlingException", "ServiceUnavailableException", "ModelNotReadyException", "ResourceExhausted",
        "ServiceUnavailable", "DeadlineExceeded", "TooManyRequests",
    }
)


def is_transient_error(error: BaseException | None) -> bool:
    """True when ``error`` is worth another attempt: a timeout, a lost connection, throttling, 408, 425, 429 or 5xx.

    The default of ``should_retry_llm_error`` and of decision retries (a decision provider may classify its own
    errors with ``should_retry``). A 400, 401, 403, 404, 422 or any other client error, a refused reply and an
    error of the code itself (``KeyError``, ``ValueError``, a ``PicoFlowError``) are not. A response the SDK was
    told not to retry (``x-should-retry: false``: its wait would pass the turn's deadline) is not either.
    """
    if error is None or isinstance(error, PicoFlowError):
        return False
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None and str(headers.get("x-should-retry", "")).lower() == "false":
        return False
    status = _status(error)
    if status is not None:
        return status in TRANSIENT_STATUSES or status >= 500
    if isinstance(error, TimeoutError | ConnectionError):
        return True
    return any(cls.__name__ in TRANSIENT_ERROR_NAMES for cls in type(error).__mro__)


def _status(error: BaseException) -> int | None:
    # OpenAI-style clients carry status_code; Google's errors a numeric code; botocore's ClientError its response.
    for value in (getattr(error, "status_code", None), getattr(error, "code", None)):
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code in TRANSIENT_ERROR_NAMES:
            return 429
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


@dataclass(frozen=True, kw_only=True)
class CallSite:
    """Where a model or decision call ran: the step, and the provider and model that served it.

    Every context a recovery or decision hook receives starts with these three fields.
    """

    step_id: str
    provider: str
    model: str

    @classmethod
    def at(cls, step_id: str, selection: ModelSelection, **details: Any) -> Self:
        """This context for a call of step ``step_id`` on ``selection``, with the context's own ``details``."""
        return cls(step_id=step_id, provider=selection.provider, model=selection.name, **details)


@dataclass(frozen=True, kw_only=True)
class ModelCallSite(CallSite):
    """A model call's site, with the cancellation signal of the parallel worker it runs in (None outside one)."""

    signal: CancellationSignal | None = None


@dataclass(frozen=True, kw_only=True)
class LlmAttemptErrorContext(ModelCallSite):
    """What ``should_retry_llm_error`` sees after one model invocation raised."""

    error: BaseException
    attempt: int
    max_attempts: int


@dataclass(frozen=True, kw_only=True)
class LlmErrorContext(ModelCallSite):
    """What ``on_llm_error`` sees once the attempts of a model call produced no accepted response."""

    kind: LlmErrorKind
    attempts: int
    stopped_because: StopReason
    error: BaseException | None = None
    last_response: Any = None


@dataclass(frozen=True, kw_only=True)
class LlmBlockedContext(ModelCallSite):
    """What ``on_llm_blocked`` sees when a provider refused the prompt or filtered the candidate."""

    reason: str
    raw_reason: str | None
    phase: Literal["prompt", "candidate"]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RetryWithModel:
    """An ``on_llm_error`` answer: continue the same step on another model for the rest of this turn."""

    selection: ModelSelection


def retry_with_model(selection: ModelSelection | Mapping[str, Any]) -> RetryWithModel:
    """Ask for one fallback model; it gets a single attempt per model call and keeps its own attempt budget out."""
    if isinstance(selection, ModelSelection):
        if "retry_attempts" in selection.model_fields_set:
            raise PicoFlowError("A retry_with_model() selection may not set retry_attempts.")
        return RetryWithModel(selection)
    if not isinstance(selection, Mapping):
        raise PicoFlowError("retry_with_model() needs a ModelSelection or a dict.")
    if "retry_attempts" in selection or "retryAttempts" in selection:
        raise PicoFlowError("A retry_with_model() selection may not set retry_attempts.")
    return RetryWithModel(ModelSelection(**selection))


DEFAULT_STALL_MS = 10_000
"""How long a streamed model call may go without a chunk (the first one included) unless a policy says otherwise:
well inside the HTTP API's 29 s and the template's 25 s function timeout, so a stalled provider ends the attempt
(``MODEL_TIMEOUT``, retried while the turn has time) rather than the whole turn budget."""

_POLICY_KEYS = ("timeout_ms", "stall_ms")


@dataclass(frozen=True)
class LlmCallPolicy:
    """The resolved, code-owned call policy of one step; never persisted.

    ``timeout_ms`` bounds one attempt as a whole; ``stall_ms`` bounds the wait for each chunk of a streamed
    attempt (None: only ``timeout_ms`` and the turn's deadline do).
    """

    timeout_ms: int | None = None
    stall_ms: int | None = DEFAULT_STALL_MS


def _checked_policy(policy: Any, owner: str) -> Mapping[str, Any]:
    if policy is None:
        return {}
    if not isinstance(policy, Mapping):
        raise PicoFlowError(f"{owner} config_llm_call_policy() must return a dict.")
    unknown = sorted(set(policy) - set(_POLICY_KEYS))
    if unknown:
        raise PicoFlowError(f"{owner} config_llm_call_policy() has unknown key(s) {', '.join(unknown)}.")
    for key in _POLICY_KEYS:
        value = policy.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise PicoFlowError(f"{owner} {key} must be a positive integer or None.")
    return policy


def resolve_call_policy(flow_policy: Any, step_policy: Any) -> LlmCallPolicy:
    """Apply a step's override to the flow policy: an absent key inherits, an int replaces, None removes."""
    flow_side = _checked_policy(flow_policy, "Flow")
    step_side = _checked_policy(step_policy, "Step")
    resolved: dict[str, int | None] = {"timeout_ms": None, "stall_ms": DEFAULT_STALL_MS}
    for key in _POLICY_KEYS:
        for side in (flow_side, step_side):
            if key in side:
                resolved[key] = side[key]
    return LlmCallPolicy(**resolved)
