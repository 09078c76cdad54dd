"""The chat page and session inspector that ``picoflow serve`` adds beside the Lambda handler's routes.

Only the local server answers these; the Lambda handler has no such routes, so a deployed function
answers them with its own 404:

* ``GET /`` is the page (``static/index.html``), and ``GET /_inspector/<file>`` its script and style sheet;
* ``GET /ai/session`` with a ``CHAT_SESSION_ID`` header returns that one session document as JSON, read
  from the engine's session store. No CORS headers are sent, so only the page itself (same origin) can read it.

The page talks to the API like any other client: ``GET /ai/flows``, ``POST /ai/run``, ``POST /ai/end``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from picoflow.engine import SESSION_ID_PATTERN
from picoflow.errors import PicoFlowError, public_message

#: Reads the JSON form of one session document, or None when there is none (or it is not the caller's).
SessionReader = Callable[[str], dict[str, Any] | None]
#: What a local route answers: status, headers (each with its values) and body.
LocalAnswer = tuple[int, dict[str, list[str]], bytes]

SESSION_ROUTE = "/ai/session"
ASSET_PREFIX = "/_inspector/"
# Header spellings the handler accepts too (some proxies drop names with underscores).
_SESSION_HEADER_KEYS = ("chat_session_id", "chat-session-id")
# The store is local (SQLite or memory) or DynamoDB: a read that takes longer than this is reported as a 503.
READ_TIMEOUT_SECONDS = 10.0
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
# The page builds its DOM from text nodes; the policy is a second line of defence: nothing but its own files.
_PAGE_HEADERS = {
    "Content-Security-Policy": [
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' blob: data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ],
    "X-Content-Type-Options": ["nosniff"],
    "Referrer-Policy": ["no-referrer"],
    "Cache-Control": ["no-store"],
}


def read_from_handler(session_id: str) -> dict[str, Any] | None:
    """Load ``session_id`` through the engine of ``handlers.api``, on the loop its turns run on.

    A document created by an authenticated principal is not shown: the local server has no caller to
    compare with, exactly like an anonymous request to the API.
    """
    from handlers.api import _get_runtime

    runtime = _get_runtime()
    doc = runtime.call(runtime.engine.session_store.load(session_id), timeout=READ_TIMEOUT_SECONDS)
    if doc is None or doc.owner is not None:
        return None
    return doc.to_json_dict()


class Inspector:
    """Answers the page's routes; ``answer`` returns None for every other request (the handler's to answer)."""

    def __init__(self, read_session: SessionReader = read_from_handler) -> None:
        self.read_session = read_session

    def answer(self, method: str, path: str, headers: Mapping[str, str]) -> LocalAnswer | None:
        if method not in ("GET", "HEAD"):
            return None
        if path == "/":
            return _asset("index.html")
        if path.startswith(ASSET_PREFIX) and path[len(ASSET_PREFIX):] in _ASSETS:
            return _asset(path[len(ASSET_PREFIX):])
        if path == SESSION_ROUTE:
            return self._session(headers)
        return None

    def _session(self, headers: Mapping[str, str]) -> LocalAnswer:
        lowered = {name.lower(): value for name, value in headers.items()}
        session_id = next((lowered[key].strip() for key in _SESSION_HEADER_KEYS if lowered.get(key, "").strip()), None)
        if session_id is None:
            return _failure(400, "BAD_REQUEST", "The CHAT_SESSION_ID header is required.")
        if not SESSION_ID_PATTERN.fullmatch(session_id):
            return _failure(400, "BAD_REQUEST", "The session id must be 1-128 letters, digits, '_' or '-'.")
        try:
            doc = self.read_session(session_id)
        except TimeoutError:
            return _failure(503, "SESSION_STORE_ERROR")
        except PicoFlowError as error:
            # E.g. a stored document that no longer validates: its code says so, its text may not leave.
            status = error.status_code if 400 <= error.status_code <= 599 else 500
            return _failure(status, error.code)
        if doc is None:
            return _failure(404, "SESSION_NOT_FOUND")
        return _json(200, doc)


def _asset(name: str) -> LocalAnswer:
    body = resources.files("picoflow.local").joinpath("static", name).read_bytes()
    return 200, {"Content-Type": [_ASSETS[name]], **_PAGE_HEADERS}, body


def _json(status: int, value: Any) -> LocalAnswer:
    headers = {"Content-Type": ["application/json"], "Cache-Control": ["no-store"]}
    headers["X-Content-Type-Options"] = ["nosniff"]
    return status, headers, json.dumps(value, ensure_ascii=False).encode("utf-8")


def _failure(status: int, code: str, message: str | None = None) -> LocalAnswer:
    return _json(status, {"success": False, "message": message or public_message(code), "code": code})
