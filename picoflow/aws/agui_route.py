"""``POST /ag-ui/{flowName}``: the AG-UI protocol (``picoflow.protocols.agui``) on the Lambda runtime.

Through the HTTP API (payload format 2.0) a Lambda function cannot stream its body: the whole event stream is
answered at once when the turn has ended. ``picoflow serve`` writes each event as it happens instead
(``stream_agui``). The request is checked by the rules of ``POST /ai/run`` first (its message limit, a registered
flow); a refused request is the usual JSON failure envelope, before any event.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from ag_ui.core import RunAgentInput, RunErrorEvent
from pydantic import ValidationError

from picoflow.aws.deadline import InvocationContext, turn_deadline, wait_limit
from picoflow.aws.observability import logger
from picoflow.aws.principal import principal
from picoflow.aws.refusals import Refusal, refusal
from picoflow.aws.relay import Relay
from picoflow.aws.requests import RunRequest
from picoflow.aws.runtime import Runtime, get_runtime
from picoflow.errors import public_message
from picoflow.protocols import agui

AGUI_PREFIX = "/ag-ui/"
#: A transport's delivery of one encoded frame: False when the client is gone (the turn goes on without it).
DeliverFrame = Callable[[str], bool]
_UNKNOWN = "SESSION_OUTCOME_UNKNOWN"


def read_agui(flow_name: str, body: Any, runtime: Runtime) -> tuple[RunAgentInput, str | None] | Refusal:
    """The run and its message, or the refusal ``POST /ai/run`` would give the same flow name and message."""
    try:
        run = agui.read_input(body)
    except ValidationError as exc:
        return refusal([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()])
    message = agui.new_user_message(run)
    try:
        RunRequest.model_validate({"flowName": flow_name, "message": message})
    except ValidationError as exc:
        return refusal([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()])
    if flow_name not in runtime.engine.get_flow_names():
        return Refusal(400, "FLOW_NOT_FOUND", public_message("FLOW_NOT_FOUND"))
    return run, message


def buffered_agui(
    flow_name: str, run: RunAgentInput, message: str | None, *, caller: str | None,
    context: InvocationContext | None, request_id: str,
) -> str:
    """The whole event stream of one run, once its turn has ended (the HTTP API's way)."""
    frames: list[str] = []
    relay_agui(get_runtime(), flow_name, run, message, frames.append, caller=caller, context=context,
               request_id=request_id)
    return "".join(frames)


def stream_agui(event: Mapping[str, Any], deliver: DeliverFrame, context: InvocationContext | None) -> bool:
    """Run the ``POST /ag-ui/{flowName}`` request ``event`` (API Gateway v2) with each frame delivered as it
    happens; False, with nothing delivered, for another route or a request the HTTP handler must refuse."""
    path = str(event.get("rawPath") or "")
    method = ((event.get("requestContext") or {}).get("http") or {}).get("method")
    if method != "POST" or not path.startswith(AGUI_PREFIX):
        return False
    body = event.get("body")
    try:
        if body is not None and event.get("isBase64Encoded"):
            body = base64.b64decode(body, validate=True).decode("utf-8")
        data = json.loads(body) if isinstance(body, str) else None
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    runtime = get_runtime()
    read = read_agui(path[len(AGUI_PREFIX):], data, runtime)
    if isinstance(read, Refusal):
        return False
    request_context = event.get("requestContext") or {}
    claims = ((request_context.get("authorizer") or {}).get("jwt") or {}).get("claims")
    relay_agui(runtime, path[len(AGUI_PREFIX):], read[0], read[1], deliver, caller=principal(claims),
               context=context, request_id=request_context.get("requestId") or uuid.uuid4().hex)
    return True


def relay_agui(
    runtime: Runtime, flow_name: str, run: RunAgentInput, message: str | None, deliver: Callable[[str], Any], *,
    caller: str | None, context: InvocationContext | None, request_id: str,
) -> None:
    """Run the turn on the runtime's loop, handing each encoded frame to ``deliver`` from this thread.

    Once ``deliver`` returns False the client is gone: later frames are dropped but the turn runs to its end.
    When the invocation is about to end first, the last frame says the outcome is unknown.
    """

    async def frames() -> AsyncIterator[str]:
        async for event in agui.run_events(runtime.engine, flow_name, run, caller=caller,
                                           deadline=turn_deadline(context), request_id=request_id, message=message):
            yield agui.encode(event)

    Relay("an AG-UI run", request_id, failed=_failed_frame(request_id), overran=_unknown_frame).relay(
        runtime, frames, deliver, wait_limit(context)
    )


def _failed_frame(request_id: str) -> Callable[[Exception], str]:
    def failed(_: Exception) -> str:
        logger.exception("AG-UI run failed", extra={"requestId": request_id})
        return agui.encode(RunErrorEvent(message=public_message("TURN_FAILED"), code="TURN_FAILED"))

    return failed


def _unknown_frame() -> str:
    return agui.encode(RunErrorEvent(message=public_message(_UNKNOWN), code=_UNKNOWN))
