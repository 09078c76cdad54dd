"""A loopback "payments" service for the effect-timing proofs: it counts refund requests and the refunds it applies.

``POST /refunds`` with a JSON body applies a refund and answers ``{"refund": "<reference>"}``. With
``honour_keys`` (the default) a request whose ``Idempotency-Key`` header it has seen before is answered with the
first request's reference and applies nothing, as payment providers do; without, every request applies a refund.
``GET /count`` answers ``{"requests": n, "applied": m}``.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class PaymentsServer:
    """The service on 127.0.0.1 (a free port), as a context manager; ``url`` is its base URL."""

    def __init__(self, *, honour_keys: bool = True) -> None:
        self.honour_keys = honour_keys
        self.requests = 0
        self.applied = 0
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def __enter__(self) -> PaymentsServer:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
                with service._lock:
                    self._answer({"requests": service.requests, "applied": service.applied})

            def do_POST(self) -> None:  # noqa: N802 - the http.server hook name
                length = int(self.headers.get("Content-Length") or 0)
                json.loads(self.rfile.read(length) or b"{}")
                key = self.headers.get("Idempotency-Key")
                with service._lock:
                    service.requests += 1
                    if service.honour_keys and key and key in service._by_key:
                        reference = service._by_key[key]
                    else:
                        service.applied += 1
                        reference = f"RF-{uuid.uuid4().hex[:8].upper()}"
                        if key:
                            service._by_key[key] = reference
                self._answer({"refund": reference})

            def _answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
