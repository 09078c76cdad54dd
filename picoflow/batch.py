"""How batch coordinator mode starts each item's session: in this process, or over the HTTP API."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from picoflow.results import RunResponse
from picoflow.wire import JSON, PLAIN_TEXT, requested_session

#: ``invoke(flow_name, message, config)`` runs one new session and returns its first response.
BatchInvoker = Callable[[str, "str | None", dict[str, Any]], Awaitable[RunResponse]]


def http_invoker(run_url: str, *, timeout: float = 30.0) -> BatchInvoker:
    """Start each item's session by POSTing to a PicoFlow run endpoint (e.g. ``https://api.example/ai/run``).

    On Lambda this spreads a large batch over many invocations instead of one function's time budget.
    """

    async def invoke(flow_name: str, message: str | None, config: dict[str, Any]) -> RunResponse:
        body: dict[str, Any] = {"flowName": flow_name, "config": config}
        if message:
            body["message"] = message
        return await asyncio.to_thread(_post, run_url, body, timeout)

    return invoke


def _post(url: str, body: dict[str, Any], timeout: float) -> RunResponse:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), method="POST", headers={"Content-Type": JSON}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - the caller's own API
            return _as_response(reply.status, reply.headers, reply.read())
    except urllib.error.HTTPError as error:
        return _as_response(error.code, error.headers, error.read())
    except (urllib.error.URLError, TimeoutError) as error:
        return RunResponse(
            success=False, completed=False, message=f"The batch endpoint did not answer: {error}",
            error_code="BATCH_ENDPOINT_UNREACHABLE", status_code=503,
        )


def _as_response(status: int, headers: Any, payload: bytes) -> RunResponse:
    content_type = (headers.get("Content-Type") or "").split(";")[0].strip()
    session = requested_session(dict(headers.items())) or ""
    text = payload.decode("utf-8", errors="replace")
    if content_type != JSON:
        # A flow answering in another content type returns its raw message, not the envelope.
        return RunResponse(
            success=200 <= status < 300, completed=False, message=text, session=session,
            content_type=content_type or PLAIN_TEXT, status_code=status,
        )
    envelope = json.loads(text or "{}")
    return RunResponse(
        success=bool(envelope.get("success")),
        completed=bool(envelope.get("completed")),
        message=envelope.get("message", ""),
        session=envelope.get("session") or session,
        content_type=envelope.get("contentType") or PLAIN_TEXT,
        error_code=envelope.get("code"),
        status_code=status,
    )
