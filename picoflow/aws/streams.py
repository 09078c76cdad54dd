"""A turn streamed to a client over a connection the adapter owns: server-sent events from ``picoflow serve``, a
WebSocket on AWS.

The request is read by the rules of ``POST /ai/run`` (the same body model, session id and ``Idempotency-Key``
checks, the same refusals), the engine's events are handed to the transport as they happen, and a client that
has gone does not stop the turn: it runs to its commit, so a keyed retry gets the committed answer.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from picoflow.aws.deadline import InvocationContext, turn_deadline, wait_limit
from picoflow.aws.idempotency import IdempotencyKey
from picoflow.aws.principal import principal
from picoflow.aws.refusals import Refusal, refusal
from picoflow.aws.relay import Relay
from picoflow.aws.requests import RunRequest, SessionId, parse_json_body
from picoflow.aws.responses import outcome_unknown
from picoflow.aws.runtime import Runtime, get_runtime
from picoflow.errors import FileRefusedError, FileStoreError, PicoFlowError
from picoflow.events import TurnEvent
from picoflow.files.intake import TakenFiles, take_files
from picoflow.results import RunResponse
from picoflow.wire import IDEMPOTENCY_HEADER, SESSION_HEADER_SPELLINGS, requested_session

_SESSION_ID: TypeAdapter[str] = TypeAdapter(SessionId)
_KEY: TypeAdapter[str] = TypeAdapter(IdempotencyKey)

#: A transport's delivery of one event: False when the client is gone (the turn goes on without it).
Deliver = Callable[[TurnEvent], bool]


@dataclass(frozen=True)
class StreamedTurn:
    """A checked request for one streamed turn."""

    request: RunRequest
    session_id: str | None
    idempotency_key: str | None


def read_turn(body: str | Mapping[str, Any] | None, session_id: Any, idempotency_key: Any) -> StreamedTurn | Refusal:
    """The turn a client asks for, or the refusal ``POST /ai/run`` would answer the same request with."""
    try:
        data = parse_json_body(body) if isinstance(body, str) else body
    except json.JSONDecodeError:
        return refusal([{"type": "json_invalid", "loc": ("body",)}])
    try:
        request = RunRequest.model_validate(data)
    except ValidationError as exc:
        return refusal([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()])
    session = session_id.strip() if isinstance(session_id, str) else session_id
    key = idempotency_key
    errors: list[dict[str, Any]] = []
    for value, adapter, name in ((session, _SESSION_ID, SESSION_HEADER_SPELLINGS[0]),
                                 (key, _KEY, IDEMPOTENCY_HEADER.lower())):
        if value not in (None, ""):
            try:
                adapter.validate_python(value)
            except ValidationError:
                errors.append({"type": "header", "loc": ("header", name)})
    if errors:
        return refusal(errors)
    return StreamedTurn(request, session or None, key.strip() if isinstance(key, str) and key.strip() else None)


def stream_http_turn(event: Mapping[str, Any], deliver: Deliver, context: InvocationContext | None) -> bool:
    """Run the ``POST /ai/run`` request ``event`` (API Gateway v2) as a streamed turn on the container's engine.

    False, with nothing delivered, when the request is refused: the HTTP handler answers it as usual then.
    """
    body = event.get("body")
    try:
        if body is not None and event.get("isBase64Encoded"):
            body = base64.b64decode(body, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    headers = event.get("headers") or {}
    turn = read_turn(body, requested_session(headers), headers.get(IDEMPOTENCY_HEADER.lower()))
    if isinstance(turn, Refusal):
        return False
    request_context = event.get("requestContext") or {}
    claims = ((request_context.get("authorizer") or {}).get("jwt") or {}).get("claims")
    relay_turn(get_runtime(), turn, deliver, caller=principal(claims), context=context,
               request_id=request_context.get("requestId"))
    return True


def refused(refused: Refusal, session_id: str | None, request_id: str) -> TurnEvent:
    """The ``aborted`` event answering a refused request."""
    return TurnEvent.ending(RunResponse(
        success=False, completed=False, message=refused.message, session=session_id or "", error_code=refused.code,
        status_code=refused.status_code, request_id=request_id,
    ))


def relay_turn(
    runtime: Runtime,
    turn: StreamedTurn,
    deliver: Deliver,
    *,
    caller: str | None,
    context: InvocationContext | None,
    request_id: str | None = None,
) -> RunResponse:
    """Run ``turn`` on the runtime's engine, handing each event to ``deliver`` from this thread as it happens.

    Once ``deliver`` reports the client gone, later events are dropped but the turn runs to its end. When the
    invocation is about to end first, the last event says the outcome is unknown (a save may be under way).
    """
    request_id = request_id or uuid.uuid4().hex
    limit = wait_limit(context)
    ends = None if limit is None else time.monotonic() + limit
    files = _take_files(runtime, turn, caller, request_id, limit)
    if isinstance(files, RunResponse):
        deliver(TurnEvent.ending(files))
        return files
    request = turn.request

    def events() -> AsyncIterator[TurnEvent]:
        return runtime.engine.stream(
            request.flow_name, request.message, turn.session_id, request.config, deadline=turn_deadline(context),
            idempotency_key=turn.idempotency_key, caller=caller, request_id=request_id, files=files.refs,
            file_data=files.data, inline_files=files.inline, approvals=request.decisions(),
        )

    def failed(exc: Exception) -> TurnEvent:
        error = PicoFlowError("The turn's stream failed.", code="TURN_FAILED")
        return TurnEvent.ending(RunResponse.failure(error, turn.session_id or "", request_id, cause=exc))

    relay = Relay("a streamed turn", request_id, failed=failed,
                  overran=lambda: TurnEvent.ending(outcome_unknown(request_id, turn.session_id)))
    # The files were taken within the same limit: what is left of it bounds the turn.
    last = relay.relay(runtime, events, deliver, None if ends is None else max(ends - time.monotonic(), 0.0))
    assert last.final and last.response is not None
    return last.response


def _take_files(
    runtime: Runtime, turn: StreamedTurn, caller: str | None, request_id: str, limit: float | None
) -> TakenFiles | RunResponse:
    request = turn.request
    if not request.files:
        return TakenFiles()
    session = turn.session_id or ""
    store = runtime.engine.file_store
    if store is None:
        return RunResponse.failure(PicoFlowError("Files are disabled.", code="FILES_DISABLED", status_code=400),
                                   session, request_id)
    taking = take_files(
        store, runtime.file_policy, file_ids=request.file_ids(), inline=request.inline_files(), caller=caller,
        session_id=turn.session_id,
    )
    try:
        taken: TakenFiles = runtime.call(taking, timeout=limit)
    except (FileRefusedError, FileStoreError) as exc:
        return RunResponse.failure(exc, session, request_id)
    except TimeoutError:
        return RunResponse.failure(FileStoreError("The file store did not answer in time."), session, request_id)
    return taken


def event_json(event: TurnEvent) -> str:
    """``{"event": name, "data": ...}``: one event as a WebSocket message."""
    return json.dumps({"event": event.event, "data": event.data})
