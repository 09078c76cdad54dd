"""Why a request was refused before it reached the engine: its status, code and fixed sentence.

Powertools reports what failed validation (where, and the error type); the client reads one fixed sentence
for the first failing part, in the order a reader would check them, never the validation text itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from picoflow.aws.idempotency import MAX_IDEMPOTENCY_KEY_CHARS
from picoflow.aws.requests import (
    CONFIG_TOO_DEEP,
    MAX_CONFIG_DEPTH,
    MAX_LISTED_FILES,
    MESSAGE_TOO_LONG,
    NOT_UNICODE,
    message_limit,
)
from picoflow.wire import IDEMPOTENCY_HEADER, SESSION_HEADER_SPELLINGS


@dataclass(frozen=True)
class Refusal:
    """A refused request's answer."""

    status_code: int
    code: str
    message: str


def _bad(message: str) -> Refusal:
    return Refusal(400, "BAD_REQUEST", message)


UNDECODABLE_BODY = _bad("The request body must be UTF-8 JSON.")
NOT_JSON = _bad("The request body must be JSON (Content-Type: application/json).")
INVALID_SESSION_ID = _bad("The session id must be 1-128 letters, digits, '_' or '-'.")
# First match wins, in the order a reader checks a request: the body's syntax, its fields, then the headers.
_BY_PART: dict[str, Refusal] = {
    "json": _bad("The request body must be valid JSON."),
    "body": _bad("The request body must be a JSON object."),
    "flowName": _bad("flowName must be a non-empty string."),
    "message": _bad("message must be a string."),
    MESSAGE_TOO_LONG: Refusal(413, "MESSAGE_TOO_LARGE", "message is longer than {limit} characters."),
    "config": _bad("config must be a JSON object."),
    "files": _bad(f"files must be a list of at most {MAX_LISTED_FILES} file ids or inline files."),
    "name": _bad("name must be a non-empty string."),
    "contentType": _bad("contentType must be a non-empty string."),
    "size": _bad("size must be a positive integer."),
    CONFIG_TOO_DEEP: _bad(f"config is nested more than {MAX_CONFIG_DEPTH} levels deep."),
    NOT_UNICODE: _bad("The request contains text that is not valid Unicode."),
    **dict.fromkeys(SESSION_HEADER_SPELLINGS, INVALID_SESSION_ID),
    IDEMPOTENCY_HEADER.lower(): _bad(
        f"{IDEMPOTENCY_HEADER} must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters."
    ),
}


def refusal(errors: Sequence[dict[str, Any]]) -> Refusal:
    """The answer to a request that failed validation with ``errors`` (Powertools' list)."""
    parts = {_part(error) for error in errors}
    part = next((name for name in _BY_PART if name in parts), "body")
    found = _BY_PART[part]
    if part == MESSAGE_TOO_LONG:
        return Refusal(found.status_code, found.code, found.message.format(limit=message_limit()))
    return found


def _part(error: dict[str, Any]) -> str:
    kind, loc = error.get("type"), tuple(error.get("loc") or ())
    if kind in (MESSAGE_TOO_LONG, CONFIG_TOO_DEEP, NOT_UNICODE):
        return str(kind)
    if kind == "json_invalid":
        return "json"
    # ("header", name), ("body", field, ...), or ("body",) for the body as a whole.
    return str(loc[1]) if len(loc) > 1 and isinstance(loc[1], str) else "body"
