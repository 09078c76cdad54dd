"""Receipts of applied turns: how an ``Idempotency-Key`` is spent in the same write as the session.

A keyed turn that lands stores a receipt (a digest of the key, a digest of the request and the
response it got) inside the session's stored item. Because the receipt travels in the same
conditional write as the turn, "the turn landed" and "the key is spent" can never disagree. The
raw key is never stored, only its digest.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Receipts kept per session (the oldest go first) ...
MAX_RECEIPTS = 16
#: ... and for how long a spent key can be replayed.
RECEIPT_MAX_AGE_SECONDS = 24 * 3600
#: Shortest key an anonymous first turn may use: its session id derives from the key alone, so the key must be
#: unguessable and unique to its client (32 hex characters carry 128 random bits; a UUID qualifies).
MIN_ANONYMOUS_KEY_CHARS = 32


class TurnReceipt(BaseModel):
    """One applied keyed turn and the response it was answered with."""

    model_config = ConfigDict(populate_by_name=True)

    key: str
    request: str
    at: int
    response: dict[str, Any] = Field(default_factory=dict)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def key_digest(key: str, caller: str = "") -> str:
    """The stored form of an ``Idempotency-Key``, scoped by the caller so keys never cross callers."""
    return _digest("picoflow-key", caller, key)


def request_digest(
    flow_name: str, message: str | None, config: dict[str, Any] | None, files: list[str] | None = None,
    decisions: list[Any] | None = None,
) -> str:
    """A digest of what a turn asked for: the same key with another body must be refused.

    ``files`` (the digests of the attached files) and ``decisions`` (on waiting tool calls) count only when there
    are some, so turns without them keep the digest they always had.
    """
    parts: list[Any] = [flow_name, message, config, *([files] if files else [])]
    if decisions:
        parts.append({"decisions": decisions})
    body = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return _digest("picoflow-request", body)


def first_turn_session_id(key: str, caller: str = "") -> str:
    """The session id a keyed first turn creates: a retry of that turn derives the same id and finds it.

    It has the shape of any other session id (32 hex characters) and reveals nothing of the key.
    """
    return _digest("picoflow-first-turn", caller, key)[:32]


def find_receipt(receipts: list[TurnReceipt], key: str) -> TurnReceipt | None:
    return next((receipt for receipt in receipts if receipt.key == key), None)


def add_receipt(receipts: list[TurnReceipt], receipt: TurnReceipt, *, now: float | None = None) -> list[TurnReceipt]:
    """``receipts`` with ``receipt`` added and the expired or surplus oldest ones dropped."""
    cutoff = (time.time() if now is None else now) - RECEIPT_MAX_AGE_SECONDS
    kept = [item for item in receipts if item.at >= cutoff and item.key != receipt.key]
    kept.append(receipt)
    return kept[-MAX_RECEIPTS:]
