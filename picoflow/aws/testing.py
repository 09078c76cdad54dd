"""Driving the Lambda handler in tests, with public names only.

``invoke`` sends one API Gateway HTTP API request (built by ``http_event``) to a handler with a
``FakeLambdaContext`` and returns what API Gateway would answer. The handler's engine is built from the
environment on the first invocation and kept for the container's life: ``reset_runtime`` drops it, so the
next invocation sees a changed environment (another store, flows or script). ``scripted_calls`` returns what
the scripted model (``PICOFLOW_SCRIPT``) received in each call, and ``read_session`` a stored session document.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from picoflow.aws.apigw import FakeLambdaContext, HeaderInput, http_event
from picoflow.aws.runtime import get_runtime, read_session, reset_runtime
from picoflow.errors import PicoFlowError
from picoflow.models.scripted import ScriptedProvider

__all__ = [
    "FakeLambdaContext", "HandlerResult", "http_event", "invoke", "read_session", "reset_runtime", "scripted_calls",
]

#: A Lambda handler: ``handler(event, context)``.
Handler = Callable[[dict[str, Any], Any], Mapping[str, Any]]


@dataclass(frozen=True)
class HandlerResult:
    """A handler's answer: the status, the headers (names lower-cased) and the body as text."""

    status: int
    headers: dict[str, str]
    body: str

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    @property
    def session(self) -> str | None:
        """The ``CHAT_SESSION_ID`` header, when the answer has one."""
        return self.headers.get("chat_session_id")


def invoke(
    handler: Handler,
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: HeaderInput | None = None,
    session: str | None = None,
    context: FakeLambdaContext | None = None,
) -> HandlerResult:
    """Call ``handler`` with the event API Gateway would send for this request.

    ``body`` is a dict or list (sent as JSON), text or bytes; ``session`` sets the ``CHAT_SESSION_ID`` header.
    """
    merged = dict(headers.items() if isinstance(headers, Mapping) else headers or ())
    if session is not None:
        merged["CHAT_SESSION_ID"] = session
    event = http_event(method, path, body=body, headers=merged)
    answer = handler(event, context or FakeLambdaContext())
    raw = answer.get("body") or ""
    if answer.get("isBase64Encoded"):
        raw = base64.b64decode(raw).decode("utf-8", errors="replace")
    names = {name.lower(): value for name, value in (answer.get("headers") or {}).items()}
    return HandlerResult(status=int(answer["statusCode"]), headers=names, body=raw)


def scripted_calls() -> list[list[BaseMessage]]:
    """The messages each model call of the handler's engine received, in order.

    Only when the engine serves its model calls from a script (``PICOFLOW_SCRIPT``); else ``PicoFlowError``.
    """
    provider = get_runtime().engine.providers.override
    if not isinstance(provider, ScriptedProvider):
        raise PicoFlowError("The handler's engine has no scripted model: set PICOFLOW_SCRIPT before the first call.")
    return provider.calls
