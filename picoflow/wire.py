"""The HTTP wire vocabulary shared by the API, the local tools and batch calls: header names and media types."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SESSION_HEADER = "CHAT_SESSION_ID"
# API Gateway forwards header names lower-cased; some proxies (sam local among them) drop names with
# underscores, so the hyphenated spelling is accepted as well.
SESSION_HEADER_SPELLINGS = ("chat_session_id", "chat-session-id")
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
RETRY_AFTER_HEADER = "Retry-After"

JSON = "application/json"
PLAIN_TEXT = "text/plain"


def requested_session(headers: Mapping[str, str] | None) -> str | None:
    """The session id a request names (first non-blank accepted spelling, stripped), if any."""
    lowered = {name.lower(): value for name, value in (headers or {}).items()}
    for spelling in SESSION_HEADER_SPELLINGS:
        value = (lowered.get(spelling) or "").strip()
        if value:
            return value
    return None


def read_envelope(content_type: str, body: str) -> dict[str, Any] | None:
    """The turn envelope a response body carries, or None when the body is a step's raw message of its own type."""
    if not content_type.startswith(JSON):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "success" in data else None
