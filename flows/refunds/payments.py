"""A stand-in for the payments service a refund goes to: it honours an ``Idempotency-Key`` as real ones do.

A real deployment calls its payment provider here, passing ``Step.tool_idempotency_key()`` as the provider's
idempotency key, so that the one window PicoFlow cannot close (the refund landed, then the process died before
the journal recorded it) is closed by the provider.
"""

from __future__ import annotations

import hashlib
import threading

_issued: dict[str, str] = {}
_lock = threading.Lock()


def issue_refund(order_id: str, sku: str, amount: float, idempotency_key: str) -> str:
    """Refund ``amount`` and return the refund's reference; the same key returns the first refund's reference."""
    with _lock:
        if idempotency_key not in _issued:
            digest = hashlib.sha256(f"{order_id}|{sku}|{amount}|{idempotency_key}".encode()).hexdigest()
            _issued[idempotency_key] = f"RF-{digest[:8].upper()}"
        return _issued[idempotency_key]


def refunds_issued() -> int:
    """How many distinct refunds this process issued."""
    with _lock:
        return len(_issued)
