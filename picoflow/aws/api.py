"""The PicoFlow HTTP API (API Gateway HTTP API, payload format 2.0) on Powertools' resolver.

Routes: ``POST /ai/run``, ``POST /ai/files``, ``POST /ai/end``, ``GET /ai/flows``, ``GET /health``,
``DELETE /ai/me`` (erases the caller's data), ``POST`` and ``GET /ai/approvals`` (reviewers), and the open
protocols: ``POST /ag-ui/{flowName}`` (AG-UI), ``POST /mcp`` (MCP),
``GET /a2a/{flowName}/.well-known/agent-card.json`` and ``POST /a2a/{flowName}`` (A2A). Powertools validates
each request against ``picoflow.aws.requests`` before a route runs, and publishes the OpenAPI document from the
same models and signatures; ``PICOFLOW_SWAGGER=true`` also serves it with a Swagger UI on ``GET /swagger``.
Every refusal and failure is this API's JSON envelope (``picoflow.aws.responses``). A project's Lambda entry
point is ``from picoflow.aws.api import app, lambda_handler``.
"""

from __future__ import annotations

import binascii
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from ag_ui.core import RunAgentInput
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

from picoflow import RunResponse
from picoflow.aws import agui_route, files_route, ws_push
from picoflow.aws.cors import cors_config
from picoflow.aws.deadline import turn_deadline, wait_limit
from picoflow.aws.erasure import ErasedEnvelope, erase_owner
from picoflow.aws.idempotency import IdempotencyKeyHeader
from picoflow.aws.observability import cold_start_metric_wanted, correlate, logger, metrics, record_turn, tracer
from picoflow.aws.principal import is_reviewer, principal
from picoflow.aws.refusals import NOT_JSON, UNDECODABLE_BODY, Refusal, refusal
from picoflow.aws.requests import (
    EndedSessionHeader,
    EndedSessionHeaderHyphenated,
    FileUploadRequest,
    ReviewRequest,
    RunRequest,
    SessionHeader,
    SessionHeaderHyphenated,
    parse_json_body,
)
from picoflow.aws.responses import (
    EndEnvelope,
    ReviewList,
    TurnEnvelope,
    echoable,
    envelope,
    failure,
    failure_body,
    outcome_unknown,
    turn_response,
    unavailable,
)
from picoflow.aws.runtime import get_runtime, read_session
from picoflow.aws.streams import stream_http_turn as stream_turn
from picoflow.errors import (
    FileStoreError,
    PicoFlowError,
    SessionStoreError,
    public_message,
)
from picoflow.files.intake import TakenFiles
from picoflow.files.store import UploadTicket
from picoflow.protocols.agui import EVENT_STREAM
from picoflow.results import wire_approval
from picoflow.wire import JSON, requested_session

__all__ = ["app", "lambda_handler", "openapi_schema", "read_session", "stream_protocol", "stream_turn"]

#: Streams the open protocols' routes as they happen under ``picoflow serve`` (``POST /ag-ui/{flowName}``).
stream_protocol = agui_route.stream_agui

API_TITLE = "PicoFlow API"
API_VERSION = "1.0.0"

Handler = TypeVar("Handler", bound=Callable[..., Any])

app = APIGatewayHttpResolver(cors=cors_config(), enable_validation=True, json_body_deserializer=parse_json_body)

# Routes such as /health publish no metric by design; Powertools would warn on every such request.
warnings.filterwarnings("ignore", message="No application metrics to publish")


def _documented(model: type[BaseModel], described: dict[int, str]) -> dict[int, Any]:
    return {status: {"description": text, "content": {JSON: {"model": model}}} for status, text in described.items()}


@app.post(
    "/ai/run",
    summary="Run one turn of a flow",
    responses=_documented(TurnEnvelope, {
        200: "The turn's envelope; a step with another content type returns its raw message instead.",
        400: "Malformed body or header, an unknown flow, or too many files.",
        404: "A file id is unknown, expired or not the caller's.",
        403: "A decision on a call that a reviewer must decide (NOT_APPROVER).",
        409: "Session conflict, flow mismatch, or a decision on a call that is not waiting (APPROVAL_NOT_PENDING).",
        413: "The message, a file, the turn's files or the session document is too large.",
        415: "A file's type is not accepted, its content does not match it, or the step's model cannot read it.",
        422: "The Idempotency-Key was already used with a different body, or is too old to replay.",
        500: "The flow failed (the session is ended unless the flow keeps it) or could not be started.",
        502: "The model service failed; the turn was not applied, retry.",
        503: "The session store or the model service is unavailable, or the save's outcome is unknown; retry.",
        504: "The turn or the model ran out of time; the turn was not applied, retry.",
    }),
)
def run_turn(
    request: RunRequest,
    session: SessionHeader = None,
    session_hyphenated: SessionHeaderHyphenated = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Response[str]:
    session_id = session or session_hyphenated
    if session_id:
        correlate(session_id)
    runtime, request_id, started = get_runtime(), _request_id(), time.perf_counter()
    files = (
        files_route.take_turn_files(request, session_id, _caller(), request_id, app.lambda_context)
        if request.files else TakenFiles()
    )
    if isinstance(files, Response):
        return files
    turn = runtime.engine.run(
        flow_name=request.flow_name, user_message=request.message, session_id=session_id, config=request.config,
        deadline=turn_deadline(app.lambda_context), idempotency_key=idempotency_key, caller=_caller(),
        request_id=request_id, files=files.refs, file_data=files.data, inline_files=files.inline,
        approvals=request.decisions(),
    )
    try:
        result: RunResponse = runtime.call(turn, timeout=wait_limit(app.lambda_context))
    except TimeoutError:
        # Flow code that never returns overran the engine's own deadline: answer before Lambda cuts the
        # connection. A save may still be under way, so the outcome is unknown rather than "not applied".
        logger.error("Turn overran the deadline", extra={"requestId": request_id})
        result = outcome_unknown(request_id, session_id)
    registered = request.flow_name in runtime.engine.get_flow_names()
    record_turn(request.flow_name, registered, result, (time.perf_counter() - started) * 1000)
    return turn_response(result)


@app.post(
    "/ai/files",
    summary="Open the upload of a file for a later turn",
    responses=_documented(UploadTicket, {
        200: "PUT the file's bytes to uploadUrl with uploadHeaders, then name fileId in POST /ai/run's files.",
        400: "Malformed body or header, or this API accepts no files.",
        413: "The file is larger than this API accepts.",
        415: "This type of file is not accepted.",
        503: "The file store is unavailable; retry.",
    }),
)
def open_file_upload(
    request: FileUploadRequest,
    session: SessionHeader = None,
    session_hyphenated: SessionHeaderHyphenated = None,
) -> Response[str]:
    return files_route.open_file_upload(
        request, session or session_hyphenated or None, _caller(), _request_id(), app.lambda_context
    )


@app.post(
    "/ai/end",
    summary="Delete a session",
    responses=_documented(EndEnvelope, {
        200: "Deleted (or no session id was given).",
        400: "The session id is invalid or the delete failed.",
        404: "No such session for this caller: it does not exist or belongs to someone else.",
        409: "The delete lost a race with a turn; retry.",
        503: "The session store is unavailable; retry.",
    }),
)
def end_session(
    session: EndedSessionHeader = None, session_hyphenated: EndedSessionHeaderHyphenated = None
) -> Response[str]:
    session_id = session or session_hyphenated
    named = echoable(session_id)
    if named:
        correlate(named)
    runtime = get_runtime()
    ending = runtime.engine.delete_session(session_id, deadline=turn_deadline(app.lambda_context), caller=_caller())
    try:
        outcome = runtime.call(ending, timeout=wait_limit(app.lambda_context))
    except TimeoutError:
        return unavailable("SESSION_STORE_ERROR", session_id or "", _request_id())
    session_id = echoable(outcome.get("session"))
    if outcome.get("success"):
        metrics.add_metric(name="SessionsEnded", unit=MetricUnit.Count, value=1)
        return envelope(200, {"success": True, "session": session_id}, session_id)
    code = outcome.get("code")
    logger.warning("Session delete failed", extra={"code": code})
    # The same 404 whether the session never existed or is someone else's; a delete that lost a race is a
    # conflict the client can retry; anything else keeps the documented 400.
    status = {"SESSION_NOT_FOUND": 404, "SESSION_CONFLICT": 409}.get(code or "", 400)
    code = "SESSION_NOT_FOUND" if status == 404 else "SESSION_DELETE_FAILED"
    body = failure_body(code, session_id, _request_id(), outcome.get("message") or public_message(code))
    return envelope(status, body, session_id)


@app.post(
    "/ai/approvals",
    summary="Decide a tool call waiting for a reviewer",
    responses=_documented(TurnEnvelope, {
        200: "Decided: an approved call ran (once); the user's next turn gets the model's follow-up.",
        400: "Malformed body.",
        403: "The caller is not in the reviewer group, or the call is in their own session (NOT_APPROVER).",
        409: "The call is not waiting (APPROVAL_NOT_PENDING), or a race with another request; retry.",
        503: "The session store is unavailable; retry.",
    }),
)
def decide_review(request: ReviewRequest, idempotency_key: IdempotencyKeyHeader = None) -> Response[str]:
    correlate(request.session)
    claims = app.current_event.request_context.authorizer.jwt_claim
    reviewer, request_id = principal(claims), _request_id()
    if reviewer is None or not is_reviewer(claims):
        return failure(403, "NOT_APPROVER", request.session, request_id)
    runtime, limit = get_runtime(), wait_limit(app.lambda_context)
    try:
        # The route names the session only: its stored flow says which flow decides.
        stored = runtime.call(runtime.engine.session_store.load(request.session), timeout=limit)
        if stored is None:
            return failure(409, "APPROVAL_NOT_PENDING", request.session, request_id)
        deciding = runtime.engine.decide(
            stored.flow.name, request.session, request.id, request.approved, reason=request.reason, reviewer=reviewer,
            deadline=turn_deadline(app.lambda_context), idempotency_key=idempotency_key, request_id=request_id,
        )
        result: RunResponse = runtime.call(deciding, timeout=limit)
    except TimeoutError:
        result = outcome_unknown(request_id, request.session)
    except PicoFlowError as exc:  # the store failed to read the session: its code's fixed sentence
        result = RunResponse.failure(exc, request.session, request_id)
    else:
        # The owner's open WebSocket gets the model's follow-up now (bounded; see picoflow.aws.ws_push).
        ws_push.push_follow_up(runtime, result, stored, request.id, app.lambda_context)
    return turn_response(result)


@app.get(
    "/ai/approvals",
    summary="List the tool calls waiting for a reviewer",
    responses=_documented(ReviewList, {
        200: "The calls waiting for a reviewer, oldest first.",
        403: "The caller is not in the reviewer group.",
        503: "The session store is unavailable; retry.",
    }),
)
def list_reviews() -> Response[str]:
    claims = app.current_event.request_context.authorizer.jwt_claim
    if not is_reviewer(claims):
        return failure(403, "NOT_APPROVER", "", _request_id())
    runtime = get_runtime()
    try:
        entries = runtime.call(runtime.engine.session_store.list_reviews(), timeout=wait_limit(app.lambda_context))
    except TimeoutError:
        return failure(503, "SESSION_STORE_ERROR", "", _request_id())
    body = {"approvals": [{**wire_approval(entry), "session": entry["session"], "flowName": entry["flowName"],
                           "createdAt": entry["createdAt"]} for entry in entries]}
    return Response(status_code=200, content_type=JSON, body=json.dumps(body))


@app.get("/ai/flows", summary="List the registered flows")
def list_flows() -> Response[str]:
    return Response(status_code=200, content_type=JSON, body=json.dumps(get_runtime().engine.get_flow_names()))


@app.get("/health", summary="Liveness check")
def health() -> Response[str]:
    return Response(status_code=200, content_type=JSON, body=json.dumps({"status": "ok"}))


@app.delete(
    "/ai/me",
    summary="Erase the caller's data",
    responses=_documented(ErasedEnvelope, {
        200: "Everything stored for the caller is gone: sessions, receipts, journal entries and files.",
        401: "The request carries no verified principal (the API has no authorizer, or none applied).",
        503: "A store is unavailable; retry (an erasure can always be run again).",
    }),
)
def erase_me() -> Response[str]:
    caller = _caller()
    if not caller:
        return failure(401, "UNAUTHENTICATED", "", _request_id())
    runtime = get_runtime()
    engine = runtime.engine
    try:
        erased = runtime.call(
            erase_owner(engine.session_store, engine.file_store, caller), timeout=wait_limit(app.lambda_context)
        )
    except (TimeoutError, SessionStoreError, FileStoreError) as error:
        code = "FILE_STORE_ERROR" if isinstance(error, FileStoreError) else "SESSION_STORE_ERROR"
        logger.error("Erasure failed", extra={"code": code, "errorType": type(error).__name__})
        return unavailable(code, "", _request_id())
    metrics.add_metric(name="PrincipalsErased", unit=MetricUnit.Count, value=1)
    return envelope(200, {"success": True, "sessions": erased.sessions, "files": erased.files})


@app.post(
    "/ag-ui/<flowName>",
    summary="Run one turn of a flow over AG-UI",
    description="An AG-UI RunAgentInput; the threadId is the session. The answer is the run's AG-UI event stream "
    "(text/event-stream), all at once when the turn has ended (picoflow serve streams it as it happens).",
    responses={
        200: {"description": "The run's AG-UI events, RUN_STARTED first, RUN_FINISHED or RUN_ERROR last.",
              "content": {EVENT_STREAM: {}}},
        **_documented(TurnEnvelope, {400: "Malformed body, a message too long, or an unknown flow."}),
    },
)
def agui_run(flowName: str, run: RunAgentInput) -> Response[str]:  # noqa: N803 - the route's own spelling
    runtime, request_id = get_runtime(), _request_id()
    read = agui_route.read_agui(flowName, app.current_event.json_body, runtime)
    if isinstance(read, Refusal):
        return _refuse(read)
    body = agui_route.buffered_agui(flowName, read[0], read[1], caller=_caller(), context=app.lambda_context,
                                    request_id=request_id)
    return Response(status_code=200, content_type=EVENT_STREAM, body=body,
                    headers={"Cache-Control": "no-cache"})


@app.post(
    "/mcp",
    summary="The flows as an MCP server (streamable HTTP, stateless, JSON answers)",
    description="One MCP tool per flow, named after it: input {message, session?, approvals?}, structured output "
    "{message, session, completed, pendingApprovals}. The session's owner is the caller's principal.",
    responses={200: {"description": "The JSON-RPC answer.", "content": {JSON: {}}},
               202: {"description": "A notification or response was accepted."}},
)
def mcp_endpoint() -> Response[str]:
    # Imported on first use: the MCP server's web stack is not every invocation's cold start.
    from picoflow.aws.mcp_route import answer_mcp

    return _asgi_answer(lambda: answer_mcp(app.current_event.raw_event, app.lambda_context, caller=_caller(),
                                           request_id=_request_id()))


@app.get("/a2a/<flowName>/.well-known/agent-card.json", summary="A flow's A2A agent card")
def a2a_card(flowName: str) -> Response[str]:  # noqa: N803 - the route's own spelling
    return _a2a(flowName)


@app.post(
    "/a2a/<flowName>",
    summary="A flow as an A2A agent (JSON-RPC: SendMessage, SendStreamingMessage)",
    description="contextId is the session; a turn with pending approvals is input-required, a failed one failed.",
    responses={200: {"description": "The JSON-RPC answer (a streaming send: its events, all at once).",
                     "content": {JSON: {}, EVENT_STREAM: {}}}},
)
def a2a_rpc(flowName: str) -> Response[str]:  # noqa: N803 - the route's own spelling
    return _a2a(flowName)


def _a2a(flow_name: str) -> Response[str]:
    if flow_name not in get_runtime().engine.get_flow_names():
        return failure(404, "NOT_FOUND", _named_session(), _request_id())
    # Imported on first use: the A2A SDK is not every invocation's cold start.
    from picoflow.aws.a2a_route import answer_a2a

    return _asgi_answer(lambda: answer_a2a(app.current_event.raw_event, flow_name, app.lambda_context,
                                           caller=_caller(), request_id=_request_id()))


def _asgi_answer(answering: Callable[[], dict[str, Any]]) -> Response[str]:
    """An ASGI application's proxy response (from Mangum) as this resolver's response; a request whose headers
    or body are not valid text (which API Gateway never forwards, but a local caller may send) is refused."""
    try:
        answer = answering()
    except UnicodeError:
        return _refuse(UNDECODABLE_BODY)
    headers = {name: value for name, value in (answer.get("headers") or {}).items()
               if name.lower() not in ("content-type", "content-length")}
    content_type = (answer.get("headers") or {}).get("content-type") or JSON
    return Response(status_code=int(answer["statusCode"]), content_type=content_type, body=answer.get("body") or "",
                    headers=headers)


if (os.environ.get("PICOFLOW_SWAGGER") or "").lower() == "true":
    app.enable_swagger(path="/swagger", title=API_TITLE, version=API_VERSION)


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI document of this API, as Powertools derives it from the routes and models."""
    schema: dict[str, Any] = json.loads(app.get_openapi_json_schema(title=API_TITLE, version=API_VERSION))
    return schema


def _handles(exc_class: type[Exception] | list[type[Exception]]) -> Callable[[Handler], Handler]:
    """``app.exception_handler``, typed: Powertools registers the handler and hands it back unchanged."""

    def register(handler: Handler) -> Handler:
        app.exception_handler(exc_class)(handler)
        return handler

    return register


@_handles(RequestValidationError)
def refuse_invalid(error: RequestValidationError) -> Response[str]:
    # Powertools reads form and multipart bodies too; their fields never make a valid turn.
    content_type = app.current_event.headers.get("content-type") or JSON
    return _refuse(refusal(error.errors()) if content_type.startswith(JSON) else NOT_JSON)


@_handles(RequestUnsupportedContentType)
def refuse_unsupported(_: RequestUnsupportedContentType) -> Response[str]:
    return _refuse(NOT_JSON)


@_handles([UnicodeDecodeError, binascii.Error])
def refuse_undecodable(_: ValueError) -> Response[str]:
    # Raised while Powertools decodes the body: bad base64, or bytes that are not UTF-8.
    return _refuse(UNDECODABLE_BODY)


@app.not_found
def not_found(_: NotFoundError) -> Response[str]:
    return failure(404, "NOT_FOUND", _named_session(), _request_id())


@_handles(Exception)
def internal_error(_: Exception) -> Response[str]:
    logger.exception("Unhandled error")
    return failure(500, "INTERNAL_ERROR", _named_session(), _request_id())


def _refuse(refused: Refusal) -> Response[str]:
    logger.info("Request refused", extra={"code": refused.code, "statusCode": refused.status_code})
    return failure(refused.status_code, refused.code, _named_session(), _request_id(), message=refused.message)


def _named_session() -> str:
    return requested_session(app.current_event.headers) or ""


def _caller() -> str | None:
    # The authorizer's verified claim names the principal: its sessions and keys are its own.
    return principal(app.current_event.request_context.authorizer.jwt_claim)


def _request_id() -> str:
    # The Lambda request id is what CloudWatch shows beside every log line of the invocation.
    context = app.lambda_context
    return getattr(context, "aws_request_id", None) or app.current_event.request_context.request_id or ""


def _resolve(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


if tracer is not None:
    _resolve = tracer.capture_lambda_handler(_resolve, capture_response=False)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
@metrics.log_metrics(capture_cold_start_metric=cold_start_metric_wanted())
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda handler: resolve one API Gateway v2 event into a proxy response."""
    return _resolve(event, context)
