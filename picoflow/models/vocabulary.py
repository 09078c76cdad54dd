"""What a provider's answers and errors mean, in its own words: the finish reasons and error codes with which it
refuses a call, the names under which it reports throttling, and the error codes that say the deployment is
misconfigured.

Each provider declares one ``Vocabulary`` (``ModelProvider.vocabulary``); the turn asks the vocabulary of the
provider that served a call and never names a provider itself. What HTTP says the same way everywhere (429, 401,
403, 404) needs no vocabulary and is read by the callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import AIMessage

from picoflow.messages import finish_reason


@dataclass(frozen=True)
class Block:
    """A detected refusal: the normalised reason, the provider's own value and where it happened."""

    reason: str
    raw_reason: str | None
    phase: Literal["prompt", "candidate"]
    details: dict[str, Any]


@dataclass(frozen=True)
class Vocabulary:
    """One provider's words for refusals, throttling and configuration faults."""

    #: Finish reasons (lower-cased, read from ``finish_reason``, ``stop_reason`` or ``stopReason``) with which a
    #: refused or filtered candidate ends.
    blocked_finish_reasons: frozenset[str] = frozenset()
    #: Error codes (lower-cased) with which the provider refuses a prompt by raising instead of answering.
    blocked_error_codes: frozenset[str] = frozenset()
    #: The ``response_metadata`` key of a prompt-level block report (with a ``block_reason``), if the provider has one.
    prompt_feedback_key: str | None = None
    #: The ``additional_kwargs`` key carrying a refusal text, if the provider answers refusals in words.
    refusal_key: str | None = None
    #: Exception class names, or codes in a botocore-style error response, that mean the call was throttled.
    throttling_names: frozenset[str] = frozenset()
    #: Codes in a botocore-style error response that refuse the credentials, with the setting to check.
    auth_codes: Mapping[str, str] = field(default_factory=dict)
    #: Codes in a botocore-style error response that say the model is unknown, with the setting to check.
    configuration_codes: Mapping[str, str] = field(default_factory=dict)

    def blocked_response(self, message: Any) -> Block | None:
        """The refusal an answer carries: a prompt block report, a filtering finish reason or a refusal text."""
        if not isinstance(message, AIMessage):
            return None
        metadata = message.response_metadata or {}
        feedback = metadata.get(self.prompt_feedback_key) if self.prompt_feedback_key else None
        if isinstance(feedback, Mapping) and feedback.get("block_reason"):
            raw = str(feedback["block_reason"])
            return Block(raw.lower(), raw, "prompt", {str(self.prompt_feedback_key): dict(feedback)})
        finish = finish_reason(metadata)
        if isinstance(finish, str) and finish.lower() in self.blocked_finish_reasons:
            details = {"safety_ratings": metadata["safety_ratings"]} if metadata.get("safety_ratings") else {}
            return Block(finish.lower(), finish, "candidate", details)
        refusal = (message.additional_kwargs or {}).get(self.refusal_key) if self.refusal_key else None
        if refusal:
            return Block("refusal", None, "candidate", {"refusal": str(refusal)})
        return None

    def blocked_error(self, error: BaseException) -> Block | None:
        """The refusal an error reports, such as a ``content_filter`` code raised for the prompt."""
        code = getattr(error, "code", None)
        if isinstance(code, str) and code.lower() in self.blocked_error_codes:
            return Block(code.lower(), code, "prompt", {})
        return None

    def is_throttling(self, error: BaseException | None) -> bool:
        """Whether ``error`` says the provider throttled the call: HTTP 429, or one of its throttling names."""
        if error is None:
            return False
        if 429 in (getattr(error, "status_code", None), getattr(error, "code", None)):
            return True
        return type(error).__name__ in self.throttling_names or error_code(error) in self.throttling_names

    def merged(self, *others: Vocabulary) -> Vocabulary:
        """A vocabulary that understands this one's words and every one of ``others``'."""
        every = (self, *others)
        return Vocabulary(
            blocked_finish_reasons=frozenset().union(*(v.blocked_finish_reasons for v in every)),
            blocked_error_codes=frozenset().union(*(v.blocked_error_codes for v in every)),
            prompt_feedback_key=next((v.prompt_feedback_key for v in every if v.prompt_feedback_key), None),
            refusal_key=next((v.refusal_key for v in every if v.refusal_key), None),
            throttling_names=frozenset().union(*(v.throttling_names for v in every)),
            auth_codes={code: setting for v in every for code, setting in v.auth_codes.items()},
            configuration_codes={code: setting for v in every for code, setting in v.configuration_codes.items()},
        )


def error_code(error: BaseException) -> str | None:
    """The code of a botocore-style error (``error.response["Error"]["Code"]``), else None."""
    response = getattr(error, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code if isinstance(code, str) else None
