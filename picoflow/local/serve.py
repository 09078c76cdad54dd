"""``picoflow serve``: a local HTTP server that feeds API Gateway v2 events to the Lambda handler.

The no-Docker equivalent of ``sam local start-api``: every request becomes the event API Gateway
would send, the handler runs in-process, and its proxy response is written back verbatim. A ``POST /ai/run``
that asks for ``Accept: text/event-stream`` is answered with the turn's events as server-sent events instead,
each written as it happens (see ``picoflow.aws.streams``; on AWS a WebSocket API streams them).
``picoflow serve`` also serves a chat page and session inspector at ``/`` (see ``picoflow.local.inspector``), which the
Lambda function itself never has, and, with a local file store (``FILES_FOLDER``), the upload URLs that
``POST /ai/files`` hands out (``PUT /ai/uploads/<fileId>``), standing in for S3's presigned URLs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.aws.cors import allowed_origin
from picoflow.aws.discovery import DECISION_PROVIDERS_VARIABLE, FLOWS_VARIABLE, load_flows
from picoflow.events import TurnEvent
from picoflow.files.local_store import LocalFileStore, store_upload_target
from picoflow.local.inspector import Inspector, session_reader
from picoflow.local.project import (
    DEFAULT_HANDLER,
    LambdaHandler,
    StreamTurn,
    check_flow_modules,
    handler_streamer,
    load_handler,
    protocol_streamer,
)
from picoflow.local.readiness import startup_warnings
from picoflow.local.tool_catalog import ToolCatalog, cached, tool_catalog
from picoflow.wire import JSON

T = TypeVar("T")

EVENT_STREAM = "text/event-stream"
RUN_PATH = "/ai/run"

# Under the state folder: the sessions when SQLITE_PATH does not say otherwise, and the uploads when neither
# FILES_BUCKET nor FILES_FOLDER does.
SESSIONS_FILE = "sessions.sqlite"
UPLOADS_FOLDER = "uploads"
# API Gateway refuses request payloads above 10 MB before invoking the integration.
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024
# The template's function timeout, which the local server gives every invocation unless told otherwise.
DEFAULT_FUNCTION_TIMEOUT_MS = 25_000
# API Gateway's own answers are a JSON ``{"message": ...}`` with these texts (not the stdlib's HTML pages).
_GATEWAY_MESSAGES = {
    400: "Bad Request",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    414: "Request-URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
# Longest request-body framing line (chunk size or trailer field) read, like the stdlib's request line limit.
_MAX_LINE_BYTES = 65536
_MAX_TRAILER_FIELDS = 100
_DIGITS = re.compile(r"[0-9]+")
_HEX_DIGITS = re.compile(rb"[0-9A-Fa-f]+")
_LINE_ENDINGS = (b"\r\n", b"\n")
_INTEGRATION_FAILURE = b'{"message":"Internal Server Error"}'


class LambdaHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that dispatches every request to one Lambda handler callable."""

    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when many clients connect at once.
    request_queue_size = 128
    #: Print one access-log line per request to stderr (the demo turns it off).
    access_log = True

    def __init__(
        self,
        address: tuple[str, int],
        lambda_handler: LambdaHandler,
        inspector: Inspector | None = None,
        uploads: LocalFileStore | None = None,
        stream_turn: StreamTurn | None = None,
    ) -> None:
        super().__init__(address, _ProxyRequestHandler)
        self.lambda_handler = lambda_handler
        #: Answers ``POST /ai/run`` with ``Accept: text/event-stream`` as server-sent events; None: always JSON.
        self.stream_turn = stream_turn
        #: The local file store whose signed upload URLs this server accepts; None: no uploads.
        self.uploads = uploads
        #: The page and ``GET /ai/session``, answered before (and instead of) the handler; None: handler only.
        self.inspector = inspector
        #: Streams the open protocols' routes (``POST /ag-ui/{flowName}``) as server-sent events; None: buffered.
        self.stream_protocol: StreamTurn | None = None
        # Like one Lambda execution environment: one event at a time. Powertools also keeps the
        # current event in process-wide state, so concurrent invocations would see each other's.
        self.invoke_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The base URL the server is listening on."""
        host, port = self.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes | bytearray) else host}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-exchange is routine, not a server fault worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _ProxyRequestHandler(BaseHTTPRequestHandler):
    server: LambdaHTTPServer
    protocol_version = "HTTP/1.1"

    # The methods an HTTP API route can name; each becomes an event and the handler decides (its router
    # answers OPTIONS preflights when CORS is on and 404 for routes it does not have).
    def do_GET(self) -> None:
        self._proxy()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if not hasattr(self, f"do_{self.command}"):
            self.send_error(HTTPStatus.METHOD_NOT_ALLOWED)
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Every framing error the server answers itself (including the stdlib's own, such as an oversized
        # header) is a JSON message like API Gateway's, and ends the connection.
        code = int(code)
        text = _GATEWAY_MESSAGES.get(code) or self.responses.get(code, ("Error",))[0]
        self.log_error("code %d, message %s", code, message or text)
        headers = {"content-type": [JSON], "connection": ["close"]}
        if code == HTTPStatus.METHOD_NOT_ALLOWED:
            headers["allow"] = [", ".join(name[3:] for name in dir(self) if name.startswith("do_"))]
        self._send(code, headers, json.dumps({"message": text}).encode("utf-8"))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
        if self.server.access_log:
            super().log_message(format, *args)

    def _proxy(self) -> None:
        try:
            body = self._read_body()
        except _PayloadTooLarge:
            self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            return
        except (_BadRequest, _Truncated):
            # A truncated body is answered too, for a client that only half-closed; a gone one never reads it.
            self.send_error(HTTPStatus.BAD_REQUEST)
            return
        path, _, query = self.path.partition("?")
        client_ip = self.client_address[0]
        headers = list(self.headers.items())
        forwarded = {
            "x-forwarded-for": client_ip,
            "x-forwarded-proto": "http",
            "x-forwarded-port": str(self.server.server_address[1]),
        }
        headers.extend((name, value) for name, value in forwarded.items() if name not in self.headers)
        # A HEAD is answered as the GET of the same path, whose body _send then leaves out.
        method = "GET" if self.command == "HEAD" else self.command
        inspector, uploads = self.server.inspector, self.server.uploads
        if inspector is not None and self._answer_locally(inspector, method, path):
            return
        target = store_upload_target(path) if method == "PUT" and uploads is not None else None
        if target is not None and uploads is not None:
            status = uploads.accept_upload(
                target, dict(parse_qsl(query)), self.headers.get("Content-Type") or "", body or b""
            )
            self._send(status, {"content-type": [JSON]}, json.dumps({"status": status}).encode("utf-8"))
            return
        event = http_event(method, path, body=body, headers=headers, query=query, source_ip=client_ip)
        streamed = method == "POST" and path == RUN_PATH and EVENT_STREAM in (self.headers.get("Accept") or "")
        if streamed and self._stream_turn(event):
            return
        if method == "POST" and self._stream_protocol(event):
            return
        try:
            with self.server.invoke_lock:
                result = self.server.lambda_handler(event, FakeLambdaContext(timeout_ms=_function_timeout_ms()))
            status, response_headers, payload = _translate_response(result)
        except Exception:
            # API Gateway answers an integration failure with a bare 500; the trace is for the developer.
            traceback.print_exc(file=sys.stderr)
            self._send(500, {"content-type": [JSON]}, _INTEGRATION_FAILURE)
            return
        self._send(status, response_headers, payload)

    def _stream_turn(self, event: dict[str, Any]) -> bool:
        """Answer a turn as server-sent events; False (nothing sent) for a request the handler must refuse."""
        if self.server.stream_turn is None:
            return False

        def send(turn_event: TurnEvent) -> bool:
            return self._write(sse_frame(turn_event))

        context = FakeLambdaContext(timeout_ms=_function_timeout_ms())
        return self.server.stream_turn(event, self._opening_stream(send), context)

    def _stream_protocol(self, event: dict[str, Any]) -> bool:
        """Answer an open protocol's streamed route frame by frame; False (nothing sent) for any other request."""
        if self.server.stream_protocol is None:
            return False

        def send(frame: Any) -> bool:
            return self._write(str(frame).encode("utf-8"))

        context = FakeLambdaContext(timeout_ms=_function_timeout_ms())
        return self.server.stream_protocol(event, self._opening_stream(send), context)

    def _opening_stream(self, send: Callable[[T], bool]) -> Callable[[T], bool]:
        """``send``, with the event stream's status and headers going out before its first item."""
        started = False

        def deliver(item: T) -> bool:
            nonlocal started
            if not started:
                started = True
                self._start_event_stream()
            return send(item)

        return deliver

    def _start_event_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", EVENT_STREAM)
        self.send_header("Cache-Control", "no-cache")
        origin = allowed_origin(self.headers.get("Origin"))
        if origin:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")
        # No length is known in advance: the stream ends when the connection closes.
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _write(self, data: bytes) -> bool:
        """Send ``data`` at once; False when the client has gone."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        return True

    def _answer_locally(self, inspector: Inspector, method: str, path: str) -> bool:
        # Outside the invoke lock: the inspector reads the session while a long turn is still running.
        try:
            answer = inspector.answer(method, path, dict(self.headers.items()))
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self._send(500, {"content-type": [JSON]}, _INTEGRATION_FAILURE)
            return True
        if answer is None:
            return False
        self._send(*answer)
        return True

    def _read_body(self) -> bytes | None:
        encodings = self.headers.get_all("Transfer-Encoding") or []
        lengths = self.headers.get_all("Content-Length") or []
        if encodings:
            # Both framings at once is the request-smuggling ambiguity; chunked is the only coding understood.
            codings = [coding.strip().lower() for value in encodings for coding in value.split(",")]
            if lengths or codings != ["chunked"]:
                raise _BadRequest
            return self._read_chunked() or None
        if not lengths:
            return None
        # Repeated Content-Length fields are only acceptable when they all agree.
        values = {part.strip() for value in lengths for part in value.split(",")}
        if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values))):
            raise _BadRequest
        length = int(values.pop())
        if length > MAX_PAYLOAD_BYTES:
            raise _PayloadTooLarge
        body = self._read_exactly(length)
        return body or None

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_field = self._read_line().split(b";", 1)[0].strip()  # chunk extensions are ignored
            if not _HEX_DIGITS.fullmatch(size_field):
                raise _BadRequest
            size = int(size_field, 16)
            if not size:
                break
            total += size
            if total > MAX_PAYLOAD_BYTES:
                raise _PayloadTooLarge
            chunks.append(self._read_exactly(size))
            if self._read_line() not in _LINE_ENDINGS:
                raise _BadRequest
        # Trailer fields, which API Gateway does not forward either, end at an empty line.
        for _ in range(_MAX_TRAILER_FIELDS + 1):
            if self._read_line() in _LINE_ENDINGS:
                return b"".join(chunks)
        raise _BadRequest

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size) if size else b""
        if len(data) < size:
            raise _Truncated
        return data

    def _read_line(self) -> bytes:
        line = self.rfile.readline(_MAX_LINE_BYTES + 1)
        if len(line) > _MAX_LINE_BYTES:
            raise _BadRequest
        if not line.endswith(b"\n"):
            raise _Truncated
        return line

    def _send(self, status: int, headers: dict[str, list[str]], payload: bytes) -> None:
        self.send_response(status)
        for name, values in headers.items():
            for value in values:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


class _PayloadTooLarge(Exception):
    pass


class _BadRequest(Exception):
    """The request body's framing is malformed or ambiguous."""


class _Truncated(Exception):
    """The client closed the connection before the whole body arrived."""


def sse_frame(event: TurnEvent) -> bytes:
    """One event as a server-sent event: its name, then its JSON data on one line."""
    return f"event: {event.event}\ndata: {json.dumps(event.data)}\n\n".encode()


def _translate_response(result: Any) -> tuple[int, dict[str, list[str]], bytes]:
    if not isinstance(result, dict) or "statusCode" not in result:
        # API Gateway treats any other return value as a 200 JSON body.
        return 200, {"content-type": [JSON]}, json.dumps(result).encode("utf-8")
    headers: dict[str, list[str]] = {}
    spelling: dict[str, str] = {}

    def add(name: str, value: Any) -> None:
        # Names merge case-insensitively but keep the handler's first spelling.
        key = spelling.setdefault(name.lower(), name)
        if str(value) not in headers.setdefault(key, []):
            headers[key].append(str(value))

    for name, value in (result.get("headers") or {}).items():
        add(name, value)
    for name, values in (result.get("multiValueHeaders") or {}).items():
        for value in values:
            add(name, value)
    for cookie in result.get("cookies") or []:
        add("Set-Cookie", cookie)
    body = result.get("body") or ""
    payload = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode("utf-8")
    return int(result["statusCode"]), headers, payload


def _function_timeout_ms() -> int:
    # The variable sam local and the Lambda runtime emulator set; the template's 25 s otherwise.
    seconds = os.environ.get("AWS_LAMBDA_FUNCTION_TIMEOUT")
    return int(float(seconds) * 1000) if seconds else DEFAULT_FUNCTION_TIMEOUT_MS


def make_server(
    host: str, port: int, handler: str | LambdaHandler = DEFAULT_HANDLER, *, inspector: bool | Inspector = False
) -> LambdaHTTPServer:
    """Bind a server on ``host:port`` (0 picks a free port) that invokes ``handler(event, context)``.

    With ``FILES_FOLDER`` set (and no ``FILES_BUCKET``) it also accepts the uploads that folder's store signs.

    ``handler`` is the callable or its ``MODULE:ATTR`` name, imported from the working directory (by default
    the project's ``handlers.api:lambda_handler``), so configure the environment (``SESSION_STORE``,
    ``PICOFLOW_FLOWS`` ...) before calling this. ``inspector=True`` adds the chat page at ``/`` and
    ``GET /ai/session``, reading sessions through the handler module's ``read_session`` (pass an
    ``Inspector`` to read them some other way), and ``GET /ai/tools``, the tools of the flows ``PICOFLOW_FLOWS``
    names. Turns are streamed as server-sent events when the handler's
    module offers ``stream_turn`` (``picoflow.aws.api`` does).
    """
    handler = load_handler(handler)
    pages = Inspector(session_reader(handler), cached(registered_tools)) if inspector is True else inspector or None
    server = LambdaHTTPServer((host, port), handler, pages, local_uploads(), handler_streamer(handler))
    server.stream_protocol = protocol_streamer(handler)
    return server


def registered_tools() -> ToolCatalog:
    """The tools of the flows the handler serves: the modules ``PICOFLOW_FLOWS`` names, as its engine loads them."""
    return tool_catalog(load_flows(os.environ.get(FLOWS_VARIABLE)))


def local_uploads() -> LocalFileStore | None:
    """The local file store named by ``FILES_FOLDER`` (None when ``FILES_BUCKET`` names S3 or neither is set)."""
    folder = os.environ.get("FILES_FOLDER")
    return LocalFileStore(folder) if folder and not os.environ.get("FILES_BUCKET") else None


def state_folder() -> Path:
    """Where ``picoflow serve`` keeps its SQLite sessions and uploads unless told otherwise.

    ``$XDG_STATE_HOME/picoflow``, by default ``~/.local/state/picoflow``: the same for every project, kept across
    restarts, and never the working directory, which stays as the user left it.
    """
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "picoflow"


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    flows: str | None = None,
    inspector: bool = True,
    handler: str | LambdaHandler = DEFAULT_HANDLER,
    decision_providers: str | None = None,
) -> int:
    """Run the local API (and, unless ``inspector`` is off, the chat page) until interrupted.

    Sessions default to the SQLite store in ``state_folder()`` and uploads to its ``uploads`` folder; ``flows``
    (comma-separated modules) sets ``PICOFLOW_FLOWS`` and ``decision_providers`` (``name=module:attribute``,
    comma-separated) ``PICOFLOW_DECISION_PROVIDERS``.

    Raises:
        ProjectError: the handler or a flow module cannot be loaded (the command prints the sentence).
    """
    os.environ.setdefault("SESSION_STORE", "SQLITE")
    state = state_folder()
    if os.environ["SESSION_STORE"].strip().upper() == "SQLITE":
        os.environ.setdefault("SQLITE_PATH", str(state / SESSIONS_FILE))
    if not os.environ.get("FILES_BUCKET"):
        os.environ.setdefault("FILES_FOLDER", str(state / UPLOADS_FOLDER))
    if flows:
        os.environ[FLOWS_VARIABLE] = flows
        check_flow_modules(flows)
    if decision_providers:
        os.environ[DECISION_PROVIDERS_VARIABLE] = decision_providers
    server = make_server(host, port, handler, inspector=inspector)
    for warning in startup_warnings(os.environ):
        print(f"Warning: {warning}", file=sys.stderr, flush=True)
    store = os.environ["SESSION_STORE"]
    where = f" in {os.environ['SQLITE_PATH']}" if store.strip().upper() == "SQLITE" else ""
    print(f"PicoFlow API listening on {server.url} (session store {store}{where})", flush=True)
    routes = ("POST /ai/run, POST /ai/files, POST /ai/end, GET /ai/flows, GET /health, DELETE /ai/me, "
              "GET and POST /ai/approvals, POST /ag-ui/<flowName>, POST /mcp, /a2a/<flowName>")
    if server.uploads is not None:
        routes += f"; uploads: PUT /ai/uploads/<fileId> into {os.environ['FILES_FOLDER']}"
    if inspector:
        routes += "; local only: GET /ai/session, GET /ai/tools"
        print(f"Chat page and session inspector: {server.url}/", flush=True)
    print(f"Routes: {routes}. Ctrl+C stops.", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nStopped.", flush=True)
    finally:
        server.server_close()
    return 0
