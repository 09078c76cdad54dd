"""A loopback HTTP endpoint that speaks enough of DynamoDB's JSON protocol to inject faults.

Point ``DYNAMODB_ENDPOINT_URL`` (or a client's ``endpoint_url``) at it. Every request is recorded with its
operation (from ``X-Amz-Target``) and arrival time. For each operation, ``plan`` lists what to do with its
next requests, one action per request:

* ``"throttle"`` -> HTTP 400 ``ThrottlingException``;
* ``"throughput"`` -> HTTP 400 ``ProvisionedThroughputExceededException``;
* ``"drop"`` -> read the request, then close the connection without answering (the request never
  reaches the table);
* ``"pass"`` -> forward to ``upstream`` (a real DynamoDB Local) and relay its answer;
* ``"late"`` -> forward (the request lands), then wait ``late_seconds`` before relaying the answer, longer than
  a client's read timeout;
* ``"hold"`` -> never forward: set ``held`` and keep the connection open until ``release`` is set (a frozen
  table), then close it without answering;
* ``"land_hold"`` -> forward (the request lands), then behave like ``"hold"``: the writer never learns it landed.

Requests beyond an operation's plan are forwarded when there is an upstream and throttled otherwise,
so a server without upstream is a table that throttles forever.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_ERROR_TYPES = {
    "throttle": "com.amazon.coral.availability#ThrottlingException",
    "throughput": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
}
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})


class FaultyDynamoDB:
    """A fault-injecting DynamoDB endpoint on 127.0.0.1; use as a context manager.

    ``retry_after_ms`` adds the ``x-amz-retry-after`` hint to throttling answers, as DynamoDB may do;
    botocore's standard retry mode then waits at least that long before the next attempt.
    """

    def __init__(self, upstream: str | None = None, *, retry_after_ms: int | None = None) -> None:
        self.upstream = upstream
        self.retry_after_ms = retry_after_ms
        self.plan: dict[str, list[str]] = {}
        self.late_seconds = 7.0
        #: Set when a request is being held; setting ``release`` lets held requests go (unanswered).
        self.held = threading.Event()
        self.release = threading.Event()
        self.requests: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.endpoint_url = ""

    def __enter__(self) -> FaultyDynamoDB:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
                owner._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="faulty-dynamodb", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def attempts(self, operation: str) -> list[float]:
        """Arrival times (``time.monotonic()``) of the requests for ``operation``."""
        with self._lock:
            return [at for op, at in self.requests if op == operation]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for op, _ in self.requests:
                counts[op] += 1
        return dict(counts)

    def _next_action(self, operation: str) -> str:
        with self._lock:
            self.requests.append((operation, time.monotonic()))
            queue = self.plan.get(operation)
            if queue:
                return queue.pop(0)
        return "pass" if self.upstream else "throttle"

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        operation = (request.headers.get("X-Amz-Target") or "").rpartition(".")[2]
        action = self._next_action(operation)
        if action == "drop":
            request.close_connection = True
            return
        if action in _ERROR_TYPES:
            payload = {"__type": _ERROR_TYPES[action], "message": "Rate of requests exceeds the allowed throughput."}
            headers = {"x-amzn-RequestId": uuid.uuid4().hex}
            if self.retry_after_ms is not None:
                headers["x-amz-retry-after"] = str(self.retry_after_ms)
            self._reply(request, 400, headers, json.dumps(payload).encode("utf-8"))
            return
        if action == "hold":
            self._hold(request)
            return
        if action not in ("pass", "late", "land_hold") or not self.upstream:
            raise ValueError(f"unknown fault action {action!r} (or no upstream to pass to)")
        status, headers, answer = self._forward(request, body)
        if action == "land_hold":
            self._hold(request)
            return
        if action == "late":
            time.sleep(self.late_seconds)
            # The client gave up waiting, which is the point of answering late.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._reply(request, status, headers, answer)
            return
        self._reply(request, status, headers, answer)

    def _hold(self, request: BaseHTTPRequestHandler) -> None:
        self.held.set()
        self.release.wait(timeout=120)
        request.close_connection = True

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict[str, str], bytes]:
        assert self.upstream is not None
        target = urlsplit(self.upstream)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
            connection.request("POST", request.path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            relayed = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            return response.status, relayed, answer
        finally:
            connection.close()

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes) -> None:
        request.send_response(status)
        if not any(name.lower() == "content-type" for name in headers):
            headers = {**headers, "Content-Type": "application/x-amz-json-1.0"}
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
