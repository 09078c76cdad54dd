"""A local OpenAI-compatible chat completions server for tests: scripted responses, recorded requests, and
optionally OpenAI's prompt-caching rule applied to the token usage it reports."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from picoflow.models.scripted import conversation_problems
from tests.support.prompt_cache import OpenAIPrefixCache, count_tokens, openai_prompt

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


def usage_block(
    prompt_tokens: int, completion_tokens: int, *, cached_tokens: int = 0, reasoning_tokens: int = 0
) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "audio_tokens": 0},
    }


def chat_completion(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    model: str = "gpt-4o",
) -> dict[str, Any]:
    """A chat.completion body; each tool call is ``{"id", "name", "args"}``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
            }
            for call in tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": usage or usage_block(0, 0),
    }


def reply_tokens(text: str | None, tool_calls: list[dict[str, Any]] | None = None) -> int:
    """The approximate output tokens of a reply: its text and its tool calls' names and arguments."""
    calls = "".join(call["name"] + json.dumps(call["args"]) for call in tool_calls or [])
    return count_tokens((text or "") + calls)


def text_pieces(text: str | None) -> list[str]:
    """``text`` as a model streams it: each word with the whitespace before it."""
    return re.findall(r"\s*\S+|\s+", text or "")


def completion_chunks(completion: dict[str, Any], *, usage: bool) -> list[dict[str, Any]]:
    """A chat.completion body as the chunks of a streamed answer: its text word by word, then its tool calls, then
    the finish reason, and its usage last when asked for (``stream_options.include_usage``)."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    deltas: list[tuple[dict[str, Any], str | None]] = [({"role": "assistant", "content": ""}, None)]
    deltas += [({"content": piece}, None) for piece in text_pieces(message.get("content"))]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        deltas.append(({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": function["name"], "arguments": ""}}]}, None))
        deltas.append(({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]}, None))
    deltas.append(({}, choice["finish_reason"]))
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]} for delta, reason in deltas]
    if usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks


class FakeOpenAIServer:
    """Serves POST /v1/chat/completions from ``responses`` in order, on a free loopback port.

    Each response is a body to return with status 200, or ``(status, body)`` or ``(status, body, headers)``, or a
    function of the request returning one of those, sent
    ``delay`` seconds after its
    request arrived; a request asking for a stream gets a 200 body as server-sent chunks, each flushed as it is
    written, ``chunk_delay`` seconds apart (see ``stream_events``). ``requests`` holds the
    parsed JSON bodies received, ``sizes`` their sizes in bytes and ``headers`` their headers. With a ``cache``,
    each 200 body's usage is replaced by the request's tokens, the part the cache holds and the reply's tokens
    (and kept in ``usages``).
    Use as a context manager.
    """

    path = CHAT_COMPLETIONS_PATH

    def __init__(self, responses: list[dict[str, Any] | tuple[Any, ...]], *, delay: float = 0.0,
                 cache: OpenAIPrefixCache | None = None, chunk_delay: float = 0.0) -> None:
        self._responses = list(responses)
        self.delay = delay
        self.chunk_delay = chunk_delay
        self.cache = cache
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.sizes: list[int] = []
        self.usages: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        #: For each streamed response, the ``time.monotonic()`` at which each of its events was written.
        self.written: list[list[float]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll interval keeps shutdown() quick at the end of each test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _problems(self, body: dict[str, Any]) -> list[str]:
        return conversation_problems(body.get("messages") or [])

    def stream_events(self, body: dict[str, Any], payload: dict[str, Any]) -> list[str]:
        """The server-sent events that stream ``payload`` to a request asking for a stream."""
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        frames = [f"data: {json.dumps(chunk)}\n\n" for chunk in completion_chunks(payload, usage=usage)]
        return [*frames, "data: [DONE]\n\n"]

    def _with_usage(self, body: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with the usage the cache rule gives for ``body`` (called in request order)."""
        usage = self.cache.request(openai_prompt(body))
        message = payload["choices"][0]["message"]
        calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"])}
                 for c in message.get("tool_calls") or []]
        output = reply_tokens(message.get("content"), calls)
        return {**payload, "usage": usage_block(usage.input_tokens, output, cached_tokens=usage.cache_read)}

    def _next(self, body: dict[str, Any], headers: dict[str, str], size: int = 0) -> tuple[Any, ...]:
        problems = self._problems(body)
        with self._lock:
            self.requests.append(body)
            self.sizes.append(size)
            self.headers.append(headers)
            if problems:
                # As the real service does: the request is refused and no response is spent on it.
                return 400, {"error": {"message": problems[0], "type": "invalid_request_error"}}
            if not self._responses:
                return 500, {"error": {"message": "the fake server has no response left", "type": "server_error"}}
            response = self._responses.pop(0)
            response = response(body) if callable(response) else response
            status, payload, *extra = response if isinstance(response, tuple) else (200, response)
            if status == 200 and self.cache is not None:
                payload = self._with_usage(body, payload)
                self.usages.append(payload["usage"])
        return status, payload, *extra

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != server.path:
                    self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) or b"{}"
                body = json.loads(data)
                status, payload, *extra = server._next(body, {k.lower(): v for k, v in self.headers.items()}, len(data))
                time.sleep(server.delay)
                if status == 200 and body.get("stream"):
                    self._stream(server.stream_events(body, payload))
                    return
                self._reply(status, payload, *extra)

            def _stream(self, events: list[str]) -> None:
                # No length: the stream ends when the connection closes (this handler speaks HTTP/1.0).
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                written: list[float] = []
                server.written.append(written)
                try:
                    for index, event in enumerate(events):
                        if index and server.chunk_delay:
                            time.sleep(server.chunk_delay)
                        self.wfile.write(event.encode())
                        self.wfile.flush()
                        written.append(time.monotonic())
                except OSError:
                    return  # the client stopped reading (a timed-out call): nothing to report

            def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                self._send(status, "application/json", json.dumps(payload).encode(), headers)

            def _send(self, status: int, content_type: str, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Silent: request lines would only clutter test output."""

        return Handler
