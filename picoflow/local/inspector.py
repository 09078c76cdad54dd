"""The chat page and session inspector that ``picoflow serve`` adds beside the Lambda handler's routes.

Only the local server answers these; the Lambda handler has no such routes, so a deployed function
answers them with its own 404:

* ``GET /`` is the page (``static/index.html``), and ``GET /_inspector/<file>`` its script and style sheet;
* ``GET /ai/session`` with a ``CHAT_SESSION_ID`` header returns that one session document as JSON, read
  through the ``read_session`` function of the handler's module (``picoflow.aws.api`` has one). No CORS
  headers are sent, so only the page itself (same origin) can read it.
* ``GET /ai/tools`` returns the description of every registered flow's tools (``{flow: {tool: description}}``),
  so the page can say what a call waiting for the user's decision does (``picoflow.local.tool_catalog``).

The page talks to the API like any other client: ``GET /ai/flows``, ``POST /ai/run``, ``POST /ai/end``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from picoflow.aws.refusals import INVALID_SESSION_ID
from picoflow.errors import PicoFlowError, public_message
from picoflow.lifecycle import SESSION_ID_PATTERN
from picoflow.local.tool_catalog import CatalogReader
from picoflow.wire import JSON, SESSION_HEADER, requested_session

#: Reads the JSON form of one session document, or None when there is none (or it is not the caller's).
SessionReader = Callable[[str], dict[str, Any] | None]
#: What a local route answers: status, headers (each with its values) and body.
LocalAnswer = tuple[int, dict[str, list[str]], bytes]

SESSION_ROUTE = "/ai/session"
TOOLS_ROUTE = "/ai/tools"
ASSET_PREFIX = "/_inspector/"
#: What a handler's module names the function that reads one session for the inspector.
SESSION_READER = "read_session"
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


def session_reader(handler: Callable[..., Any]) -> SessionReader | None:
    """The ``read_session`` function of the module that defines ``handler``, if it has one."""
    return getattr(sys.modules.get(getattr(handler, "__module__", "")), SESSION_READER, None)


class Inspector:
    """Answers the page's routes; ``answer`` returns None for every other request (the handler's to answer).

    Without ``read_session`` only the page is served: ``GET /ai/session`` is left to the handler; without
    ``read_tools``, ``GET /ai/tools`` is too (the page then names a waiting call's tool without its description).
    """

    def __init__(self, read_session: SessionReader | None, read_tools: CatalogReader | None = None) -> None:
        self.read_session = read_session
        self.read_tools = read_tools

    def answer(self, method: str, path: str, headers: Mapping[str, str]) -> LocalAnswer | None:
        if method not in ("GET", "HEAD"):
            return None
        if path == "/":
            return _asset("index.html")
        if path.startswith(ASSET_PREFIX) and path[len(ASSET_PREFIX):] in _ASSETS:
            return _asset(path[len(ASSET_PREFIX):])
        if path == SESSION_ROUTE and self.read_session is not None:
            return self._session(self.read_session, headers)
        if path == TOOLS_ROUTE and self.read_tools is not None:
            return _json(200, self.read_tools())
        return None

    def _session(self, read_session: SessionReader, headers: Mapping[str, str]) -> LocalAnswer:
        session_id = requested_session(headers)
        if session_id is None:
            return _failure(400, "BAD_REQUEST", f"The {SESSION_HEADER} header is required.")
        if not SESSION_ID_PATTERN.fullmatch(session_id):
            return _failure(400, INVALID_SESSION_ID.code, INVALID_SESSION_ID.message)
        try:
            doc = read_session(session_id)
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
    headers = {"Content-Type": [JSON], "Cache-Control": ["no-store"]}
    headers["X-Content-Type-Options"] = ["nosniff"]
    return status, headers, json.dumps(value, ensure_ascii=False).encode("utf-8")


def _failure(status: int, code: str, message: str | None = None) -> LocalAnswer:
    return _json(status, {"success": False, "message": message or public_message(code), "code": code})
