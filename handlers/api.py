"""Lambda entry point for the PicoFlow HTTP API (API Gateway HTTP API, payload format 2.0).

Routes: ``POST /ai/run``, ``POST /ai/end``, ``GET /ai/flows``, ``GET /health``. The engine is built
once per container from the environment: ``SESSION_STORE``/``SESSION_TABLE`` pick the store,
``PICOFLOW_FLOWS`` the flow modules, ``PICOFLOW_SCRIPT`` a scripted model for offline runs,
``OPENAI_API_KEY_PARAMETER`` the SSM SecureString holding the OpenAI key. ``PICOFLOW_SWAGGER=true``
serves the OpenAPI document and a Swagger UI on ``GET /swagger`` (only where a route reaches it, e.g.
``picoflow serve``).

Idempotent turns: a turn with an ``Idempotency-Key`` header is applied at most once. The engine writes a
receipt of the key (scoped by the JWT subject when there is one) in the same conditional write as the
session, so a retry with the same key and body gets the original status and body back (plus
``Idempotent-Replayed: true``) without running again, whatever happened to the first attempt; a
different body is refused with 422 ``IDEMPOTENCY_KEY_MISMATCH``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import threading
import time
import warnings
from collections.abc import Coroutine
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, CORSConfig, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from picoflow import Flow, FlowEngine, RunResponse
from picoflow.engine import SESSION_ID_PATTERN
from picoflow.errors import RETRY_AFTER_SECONDS, public_message
from picoflow.models.factory import default_registry
from picoflow.session.factory import store_from_env

SESSION_HEADER = "CHAT_SESSION_ID"
# API Gateway forwards header names lower-cased; some proxies (sam local among them) drop names with
# underscores, so the hyphenated spelling is accepted as well.
_SESSION_HEADER_KEYS = ("chat_session_id", "chat-session-id")
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY_CHARS = 256
_IDEMPOTENCY_KEY_PATTERN = re.compile(rf"[\x20-\x7e]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}")
REPLAYED_HEADER = "Idempotent-Replayed"
# Deeper config objects are refused: the engine copies and serialises config recursively.
MAX_CONFIG_DEPTH = 32
DEFAULT_FLOW_MODULES = "flows"
DEFAULT_PRINCIPAL_CLAIM = "sub"
# What a browser on another origin may send and read; template.yaml's CorsConfiguration lists the same.
CORS_REQUEST_HEADERS = ("content-type", "authorization", "chat_session_id", "idempotency-key")
CORS_EXPOSED_HEADERS = ("chat_session_id", "idempotent-replayed", "retry-after")
CORS_DEFAULT_MAX_AGE_SECONDS = 600
DEFAULT_MAX_MESSAGE_CHARS = 100_000
# Time kept back from the Lambda deadline for the final save and the response.
DEADLINE_MARGIN_SECONDS = 2.0
# The handler stops waiting for the engine this long before Lambda would end the invocation.
HARD_LIMIT_MARGIN_SECONDS = 0.5
# The key is read once per container, before any turn: bounded so a stalled SSM cannot eat the first turn.
SSM_CLIENT_CONFIG = Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "total_max_attempts": 2})
_CONFLICT_CODES = frozenset({"SESSION_CONFLICT", "SESSION_FLOW_MISMATCH", "SESSION_FLOW_INVARIANT"})
_JSON = "application/json"
_PLAIN = "text/plain"

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "picoflow"
logger = Logger(service=SERVICE)
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "PicoFlow", service=SERVICE)
# X-Ray tracing needs the optional aws-xray-sdk (aws-lambda-powertools[tracer]); without it the API runs untraced.
tracer = Tracer() if importlib.util.find_spec("aws_xray_sdk") else None


def cors_config(environ: dict[str, str] | None = None) -> CORSConfig | None:
    """The resolver's CORS rules from ``CORS_ALLOW_ORIGIN`` (comma-separated origins), mirroring the template's."""
    env = os.environ if environ is None else environ
    origins = [origin.strip() for origin in (env.get("CORS_ALLOW_ORIGIN") or "").split(",") if origin.strip()]
    if not origins:
        return None
    return CORSConfig(
        allow_origin=origins[0],
        extra_origins=origins[1:],
        allow_headers=list(CORS_REQUEST_HEADERS),
        expose_headers=list(CORS_EXPOSED_HEADERS),
        max_age=int(env.get("CORS_MAX_AGE_SECONDS") or CORS_DEFAULT_MAX_AGE_SECONDS),
        allow_credentials=False,
    )


app = APIGatewayHttpResolver(cors=cors_config())

# Routes such as /health publish no metric by design; Powertools would warn on every such request.
warnings.filterwarnings("ignore", message="No application metrics to publish")


class RequestError(Exception):
    """A request refused before it reaches the engine."""

    def __init__(self, message: str, *, status_code: int = 400, code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code


# -- the container's engine ------------------------------------------------------------------------


class _Runtime:
    """The engine plus the event loop it lives on, shared by every invocation of this container.

    One long-lived loop (on its own thread) keeps the async HTTP clients that the engine caches with
    its chat models usable across invocations; a loop per invocation would strand their connections.
    """

    def __init__(self, engine: FlowEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="picoflow-engine-loop", daemon=True).start()

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coroutine`` on the engine's loop; ``TimeoutError`` (and the task cancelled) after ``timeout``."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None


_runtime: _Runtime | None = None
_runtime_lock = threading.Lock()


def get_engine() -> FlowEngine:
    """The container's ``FlowEngine``, built from the environment on first use."""
    return _get_runtime().engine


def _get_runtime() -> _Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = _Runtime(build_engine())
        return _runtime


def build_engine(environ: dict[str, str] | None = None) -> FlowEngine:
    """A new engine configured from ``environ`` (default: the process environment)."""
    env = dict(os.environ if environ is None else environ)
    if not env.get("PICOFLOW_SCRIPT") and not env.get("OPENAI_API_KEY") and env.get("OPENAI_API_KEY_PARAMETER"):
        key = read_openai_key(env["OPENAI_API_KEY_PARAMETER"])
        if key:
            env["OPENAI_API_KEY"] = key
    flows = load_flows(env.get("PICOFLOW_FLOWS") or DEFAULT_FLOW_MODULES)
    engine = FlowEngine(flows=flows, session_store=store_from_env(env), providers=default_registry(env))
    logger.info(
        "Engine ready",
        extra={"flows": engine.get_flow_names(), "store": type(engine.session_store).__name__},
    )
    return engine


def read_openai_key(parameter_name: str) -> str | None:
    """Decrypt the SecureString ``parameter_name``; None (logged) when it cannot be read."""
    from aws_lambda_powertools.utilities.parameters import SSMProvider

    try:
        return SSMProvider(boto_config=SSM_CLIENT_CONFIG).get(parameter_name, decrypt=True)
    except Exception as exc:  # noqa: BLE001 - a missing key must not take down routes that need none
        logger.error(
            "Cannot read the OpenAI key parameter", extra={"parameter": parameter_name, "error": type(exc).__name__}
        )
        return None


def load_flows(modules: str | None = None) -> list[type[Flow]]:
    """The flow classes defined in the comma-separated ``modules``; a package includes its submodules.

    ``modules`` is ``PICOFLOW_FLOWS``; when that is set, exactly those modules are loaded. Unset (or the
    default, ``flows``), the flows are the installed flow packages plus the application's own: every module
    named by an entry point of the ``picoflow.flows`` group (declared by a flow package, e.g.
    ``[project.entry-points."picoflow.flows"] travel = "travel_flows"`` in its pyproject.toml), then the
    ``flows`` package when one is importable (here the bundled example flows). Without either, loading fails.

    A class counts when it subclasses ``Flow``, implements ``config_model`` and is defined in (not
    merely imported into) one of those modules.
    """
    names = [part.strip() for part in (modules or "").split(",") if part.strip()]
    if not names or names == [DEFAULT_FLOW_MODULES]:
        from importlib.metadata import entry_points

        installed = sorted(entry_points(group="picoflow.flows"), key=lambda point: point.name)
        names = [point.module for point in installed]
        if importlib.util.find_spec(DEFAULT_FLOW_MODULES) is not None or not names:
            names.insert(0, DEFAULT_FLOW_MODULES)
        names = list(dict.fromkeys(names))
    found: list[type[Flow]] = []
    for name in names:
        module = importlib.import_module(name)
        loaded = [module]
        if hasattr(module, "__path__"):
            submodules = pkgutil.walk_packages(module.__path__, f"{name}.")
            loaded += [importlib.import_module(info.name) for info in submodules]
        for mod in loaded:
            for value in vars(mod).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, Flow)
                    and value.__module__ == mod.__name__
                    and value.config_model is not Flow.config_model
                    and value not in found
                ):
                    found.append(value)
    return found


# -- OpenAPI description ---------------------------------------------------------------------------
# The routes read the raw event so that every refusal keeps this API's own envelope (Powertools'
# request validation would answer with its own 422 body); these schemas describe that contract for the
# published OpenAPI document.

_ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["success", "completed", "message", "session"],
    "properties": {
        "success": {"type": "boolean"},
        "completed": {"type": "boolean"},
        "message": {"description": "The reply on success, the reason on failure."},
        "session": {"type": "string"},
        "contentType": {"type": "string", "description": "Present on success."},
        "code": {"type": "string", "description": "Present on failure, e.g. SESSION_CONFLICT."},
    },
}
_END_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["success", "session"],
    "properties": {
        "success": {"type": "boolean"},
        "session": {"type": "string"},
        "message": {"type": "string", "description": "Present on failure."},
        "code": {"type": "string", "description": "Present on failure."},
    },
}
_SESSION_PARAMETER: dict[str, Any] = {
    "name": SESSION_HEADER,
    "in": "header",
    "required": False,
    "description": "The session to continue; omit it to start a new one.",
    "schema": {"type": "string", "pattern": SESSION_ID_PATTERN.pattern},
}
_RUN_OPENAPI: dict[str, Any] = {
    "parameters": [
        _SESSION_PARAMETER,
        {
            "name": IDEMPOTENCY_HEADER,
            "in": "header",
            "required": False,
            "description": "Makes a retried turn return the original response instead of running again.",
            "schema": {"type": "string", "pattern": f"^[ -~]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}$"},
        },
    ],
    "requestBody": {
        "required": True,
        "content": {
            _JSON: {
                "schema": {
                    "type": "object",
                    "required": ["flowName"],
                    "properties": {
                        "flowName": {"type": "string", "minLength": 1},
                        "message": {
                            "anyOf": [{"type": "string", "maxLength": DEFAULT_MAX_MESSAGE_CHARS}, {"type": "null"}]
                        },
                        "config": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                    },
                }
            }
        },
    },
}


def _json_responses(schema: dict[str, Any], *described: tuple[int, str]) -> dict[int, Any]:
    content = {_JSON: {"schema": schema}}
    return {status: {"description": text, "content": content} for status, text in described}


def openapi_schema() -> dict[str, Any]:
    """The OpenAPI document of this API, as the Powertools resolver derives it from the routes."""
    return json.loads(app.get_openapi_json_schema(title="PicoFlow API", version="1.0.0"))


# -- routes ----------------------------------------------------------------------------------------


@app.post(
    "/ai/run",
    summary="Run one turn of a flow",
    responses=_json_responses(
        _ENVELOPE_SCHEMA,
        (200, "The turn's envelope; a step with another content type returns its raw message instead."),
        (400, "Malformed body or header, or an unknown flow."),
        (409, "Session conflict or flow mismatch."),
        (413, "The message or the session document is too large."),
        (422, "The Idempotency-Key was already used with a different body, or is too old to replay."),
        (500, "The flow failed (the session is ended unless the flow keeps it) or could not be started."),
        (502, "The model service failed; the session is unchanged, retry."),
        (503, "The session store or the model service is unavailable, or the save's outcome is unknown; retry."),
        (504, "The turn or the model ran out of time; the session is unchanged, retry."),
    ),
    openapi_extensions=_RUN_OPENAPI,
)
def run_turn() -> Response[str]:
    request = _json_object(_request_body())
    flow_name = request.get("flowName")
    if not isinstance(flow_name, str) or not flow_name.strip():
        raise RequestError("flowName must be a non-empty string.")
    message = request.get("message")
    if message is not None and not isinstance(message, str):
        raise RequestError("message must be a string.")
    limit = int(os.environ.get("PICOFLOW_MAX_MESSAGE_CHARS") or DEFAULT_MAX_MESSAGE_CHARS)
    if message is not None and len(message) > limit:
        raise RequestError(f"message is longer than {limit} characters.", status_code=413, code="MESSAGE_TOO_LARGE")
    config = request.get("config")
    if config is not None and not isinstance(config, dict):
        raise RequestError("config must be a JSON object.")
    if config is not None and _nested_deeper_than(config, MAX_CONFIG_DEPTH):
        raise RequestError(f"config is nested more than {MAX_CONFIG_DEPTH} levels deep.")
    turn = {"flowName": flow_name, "message": message, "config": config}
    try:
        # JSON may escape lone surrogates; they decode into text that no store or model can encode.
        json.dumps(turn, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError("The request contains text that is not valid Unicode.") from exc
    session_id = _session_id()
    idempotency_key = _idempotency_key()
    if session_id:
        logger.set_correlation_id(session_log_id(session_id))

    return _run(_get_runtime(), turn, session_id, idempotency_key)


@app.post(
    "/ai/end",
    summary="Delete a session",
    responses=_json_responses(
        _END_SCHEMA,
        (200, "Deleted (or no session id was given)."),
        (400, "The session id is invalid or the delete failed."),
        (404, "No such session for this caller: it does not exist or belongs to someone else."),
    ),
    openapi_extensions={"parameters": [_SESSION_PARAMETER]},
)
def end_session() -> Response[str]:
    session_id = _session_header()
    if _echoable(session_id):
        logger.set_correlation_id(session_log_id(session_id))
    runtime = _get_runtime()
    ending = runtime.engine.delete_session(session_id, deadline=_deadline(), caller=_caller())
    try:
        outcome = runtime.call(ending, timeout=_hard_limit())
    except TimeoutError:
        code = "SESSION_STORE_ERROR"
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS[code])}
        return _failure(503, public_message(code), code, headers=retry)
    session = _echoable(outcome.get("session"))
    if outcome.get("success"):
        metrics.add_metric(name="SessionsEnded", unit=MetricUnit.Count, value=1)
        return _envelope(200, {"success": True, "session": session}, session)
    logger.warning("Session delete failed", extra={"code": outcome.get("code")})
    if outcome.get("code") == "SESSION_NOT_FOUND":
        # The same answer whether the session never existed or belongs to another caller.
        return _envelope(404, _failure_body(outcome.get("message", ""), session, "SESSION_NOT_FOUND"), session)
    # A delete that lost a race is a conflict the client can retry; anything else keeps the documented 400.
    status = 409 if outcome.get("code") == "SESSION_CONFLICT" else 400
    return _envelope(status, _failure_body(outcome.get("message", ""), session, "SESSION_DELETE_FAILED"), session)


@app.get(
    "/ai/flows",
    summary="List the registered flows",
    responses=_json_responses({"type": "array", "items": {"type": "string"}}, (200, "The registered flow names.")),
)
def list_flows() -> Response[str]:
    return Response(status_code=200, content_type=_JSON, body=json.dumps(get_engine().get_flow_names()))


@app.get(
    "/health",
    summary="Liveness check",
    responses=_json_responses({"type": "object", "properties": {"status": {"const": "ok"}}}, (200, "Up.")),
)
def health() -> Response[str]:
    return Response(status_code=200, content_type=_JSON, body=json.dumps({"status": "ok"}))


if (os.environ.get("PICOFLOW_SWAGGER") or "").lower() == "true":
    app.enable_swagger(path="/swagger", title="PicoFlow API", version="1.0.0")


@app.exception_handler(RequestError)
def refuse(error: RequestError) -> Response:
    logger.info("Request refused", extra={"code": error.code, "statusCode": error.status_code})
    return _failure(error.status_code, error.message, error.code)


@app.not_found
def not_found(_: NotFoundError) -> Response:
    return _failure(404, "No such route.", "NOT_FOUND")


@app.exception_handler(Exception)
def internal_error(error: Exception) -> Response:
    logger.exception("Unhandled error")
    return _failure(500, "Internal error.", "INTERNAL_ERROR")


# -- turns -----------------------------------------------------------------------------------------


def _run(runtime: _Runtime, turn: dict[str, Any], session_id: str | None, key: str | None) -> Response:
    flow_name = turn["flowName"]
    started = time.perf_counter()
    request_id = _request_id() or ""
    try:
        result: RunResponse = runtime.call(
            runtime.engine.run(
                flow_name=flow_name,
                user_message=turn["message"],
                session_id=session_id,
                config=turn["config"],
                deadline=_deadline(),
                idempotency_key=key,
                caller=_caller(),
                request_id=request_id,
            ),
            timeout=_hard_limit(),
        )
    except TimeoutError:
        # The engine overran its own deadline (flow code that never returns): answer before Lambda cuts the
        # connection. A save may still be under way, so the outcome is unknown rather than "not applied".
        logger.error("Turn overran the deadline", extra={"requestId": request_id})
        result = _overran(request_id, session_id)
    latency_ms = (time.perf_counter() - started) * 1000
    _record_turn(flow_name, flow_name in runtime.engine.get_flow_names(), result, latency_ms)

    headers: dict[str, str] = {}
    if result.replayed:
        metrics.add_metric(name="IdempotentReplays", unit=MetricUnit.Count, value=1)
        headers[REPLAYED_HEADER] = "true"
    if result.retry_after is not None:
        headers["Retry-After"] = str(result.retry_after)
    if not result.success:
        return _envelope(_failure_status(result.status_code), result.envelope(), result.session, headers)
    if result.content_type != _PLAIN:
        body = result.message if isinstance(result.message, str) else json.dumps(result.message)
        headers[SESSION_HEADER] = result.session
        return Response(status_code=200, content_type=result.content_type, body=body, headers=headers)
    return _envelope(200, result.envelope(), result.session, headers)


def _caller() -> str | None:
    # The authorizer's verified claim names the principal: its sessions and keys are its own.
    claims = app.current_event.request_context.authorizer.jwt_claim or {}
    value = claims.get(os.environ.get("PICOFLOW_PRINCIPAL_CLAIM") or DEFAULT_PRINCIPAL_CLAIM)
    return str(value) if value else None


def session_log_id(session_id: str) -> str:
    """What log lines carry for a session: a digest, since the id itself lets anyone holding it continue."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:16]


def _request_id() -> str | None:
    # The Lambda request id is what CloudWatch shows beside every log line of the invocation.
    context = app.lambda_context
    return getattr(context, "aws_request_id", None) or app.current_event.request_context.request_id or None


# -- helpers ---------------------------------------------------------------------------------------


def _request_body() -> str | None:
    try:
        return app.current_event.decoded_body
    except ValueError as exc:  # bad base64 or bytes that are not UTF-8
        raise RequestError("The request body must be UTF-8 JSON.") from exc


def _refuse_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; stored, they would silently become null.
    raise ValueError(f"{name} is not a JSON value")


def _json_object(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "", parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise RequestError("The request body must be valid JSON.") from exc
    if not isinstance(value, dict):
        raise RequestError("The request body must be a JSON object.")
    return value


def _nested_deeper_than(value: Any, limit: int) -> bool:
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _headers() -> dict[str, str]:
    return {name.lower(): value for name, value in (app.current_event.headers or {}).items()}


def _session_header() -> str | None:
    headers = _headers()
    for key in _SESSION_HEADER_KEYS:
        value = (headers.get(key) or "").strip()
        if value:
            return value
    return None


def _session_id() -> str | None:
    # Checked here because the idempotency table is read before the engine sees the id.
    value = _session_header()
    if value is not None and not SESSION_ID_PATTERN.fullmatch(value):
        raise RequestError("The session id must be 1-128 letters, digits, '_' or '-'.")
    return value


def _echoable(session: str | None) -> str:
    # Only a well-formed id is sent back: anything else could smuggle junk into a response header.
    return session if session and SESSION_ID_PATTERN.fullmatch(session) else ""


def _idempotency_key() -> str | None:
    value = _headers().get(IDEMPOTENCY_HEADER.lower())
    if value is None:
        return None
    value = value.strip()
    if not _IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
        raise RequestError(f"{IDEMPOTENCY_HEADER} must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters.")
    return value


def _hard_limit() -> float | None:
    context = app.lambda_context
    if context is None:
        return None
    return max(context.get_remaining_time_in_millis() / 1000 - HARD_LIMIT_MARGIN_SECONDS, 0.1)


def _overran(request_id: str, session_id: str | None) -> RunResponse:
    code = "SESSION_OUTCOME_UNKNOWN"
    return RunResponse(
        success=False, completed=False, message=public_message(code), session=session_id or "", error_code=code,
        status_code=503, request_id=request_id, retry_after=RETRY_AFTER_SECONDS[code],
    )


def _deadline() -> float | None:
    context = app.lambda_context
    if context is None:
        return None
    return time.monotonic() + context.get_remaining_time_in_millis() / 1000 - DEADLINE_MARGIN_SECONDS


def _failure_status(status_code: int) -> int:
    return status_code if 400 <= status_code <= 599 else 500


def _record_turn(flow_name: str, registered: bool, result: RunResponse, latency_ms: float) -> None:
    # Only registered names become a dimension or annotation: a client-chosen flowName must not mint new series.
    if registered:
        metrics.add_dimension(name="flow", value=flow_name)
        if tracer is not None:
            tracer.put_annotation("flow", flow_name)
    metrics.add_metric(name="Turns", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="TurnLatency", unit=MetricUnit.Milliseconds, value=latency_ms)
    if result.tokens is not None:
        metrics.add_metric(name="InputTokens", unit=MetricUnit.Count, value=result.tokens.input_tokens)
        metrics.add_metric(name="OutputTokens", unit=MetricUnit.Count, value=result.tokens.output_tokens)
    if result.session:
        logger.set_correlation_id(session_log_id(result.session))
    if not result.success:
        metrics.add_metric(name="TurnFailures", unit=MetricUnit.Count, value=1)
        if result.error_code in _CONFLICT_CODES:
            metrics.add_metric(name="SessionConflicts", unit=MetricUnit.Count, value=1)
    logger.info(
        "Turn finished",
        extra={
            "flow": flow_name if registered else None,
            "success": result.success,
            "completed": result.completed,
            "code": result.error_code,
            "statusCode": result.status_code if not result.success else 200,
            "latencyMs": round(latency_ms, 1),
        },
    )


def _envelope(
    status_code: int, body: dict[str, Any], session: str | None, headers: dict[str, str] | None = None
) -> Response:
    headers = {**(headers or {}), **({SESSION_HEADER: session} if session else {})}
    return Response(status_code=status_code, content_type=_JSON, body=json.dumps(body), headers=headers)


def _failure(status_code: int, message: str, code: str, headers: dict[str, str] | None = None) -> Response:
    session = _echoable(_session_header())
    return _envelope(status_code, _failure_body(message, session, code), session, headers)


def _failure_body(message: str, session: str, code: str) -> dict[str, Any]:
    return {
        "success": False, "completed": False, "message": message, "session": session, "code": code,
        "requestId": _request_id() or "",
    }


def _resolve(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


if tracer is not None:
    _resolve = tracer.capture_lambda_handler(_resolve, capture_response=False)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics(capture_cold_start_metric=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda handler: resolve one API Gateway v2 event into a proxy response."""
    return _resolve(event, context)
