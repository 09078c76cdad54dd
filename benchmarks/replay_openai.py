"""The profile-collection replies served over HTTP as OpenAI Chat Completions, in a process of its own.

Run: .venv/bin/python -m benchmarks.replay_openai [--reply TEXT]  (prints its base URL, serves until killed)

The replies of ``benchmarks/collection.py`` in order, one per ``POST /v1/chat/completions``, each request
checked against the rules the real service enforces (an illegal conversation gets a 400, as it would
there); ``POST /reset`` starts the conversation over and ``GET /cursor`` tells how many replies were
used; with ``--reply`` every request gets that one text instead. HTTP/1.1 with keep-alive, like the real
service, so a client keeps its connection between calls. Running it in another process keeps the server's
CPU out of a benchmark's measurements.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.collection import USAGE, all_replies  # noqa: E402
from picoflow.models.scripted import conversation_problems  # noqa: E402
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, usage_block  # noqa: E402

MODEL = "gpt-4o"


def completions() -> list[dict[str, Any]]:
    """The chat.completion bodies of the conversation, tool call ids numbered like the replayed model's."""
    bodies = []
    for number, reply in enumerate(all_replies(), start=1):
        calls = [
            {"id": f"call_{number}_{index}", "name": call["name"], "args": call["args"]}
            for index, call in enumerate(reply.get("tool_calls") or [])
        ]
        usage = usage_block(USAGE["input_tokens"], USAGE["output_tokens"])
        bodies.append(chat_completion(content=reply["content"] or None, tool_calls=calls, usage=usage, model=MODEL))
    return bodies


class ReplayOpenAIServer(FakeOpenAIServer):
    """Serves ``replies`` in order, again and again after each reset; keeps no record of requests."""

    def __init__(self, replies: list[dict[str, Any]], *, repeat: bool = False) -> None:
        super().__init__([])
        self._replies = replies
        self._repeat = repeat
        self.cursor = 0

    def _next(self, body: dict[str, Any], headers: dict[str, str], size: int = 0) -> tuple[int, dict[str, Any]]:
        problems = conversation_problems(body.get("messages") or [])
        if problems:
            return 400, {"error": {"message": problems[0], "type": "invalid_request_error"}}
        with self._lock:
            if self._repeat:
                self.cursor %= len(self._replies)
            if self.cursor >= len(self._replies):
                return 500, {"error": {"message": "the conversation has no reply left", "type": "server_error"}}
            reply = self._replies[self.cursor]
            self.cursor += 1
        return 200, reply

    def _handler_class(self) -> type:
        server = self
        base = super()._handler_class()

        class Handler(base):  # type: ignore[misc, valid-type]
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes: without this, Nagle's algorithm holds the body until
                # the client's delayed ACK of the headers (some 40 ms per call on loopback).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                if self.path == "/reset":
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    with server._lock:
                        server.cursor = 0
                    self._reply(200, {"cursor": 0})
                    return
                super().do_POST()

            def do_GET(self) -> None:
                self._reply(200, {"cursor": server.cursor})

        return Handler


class ReplayServerProcess:
    """``ReplayOpenAIServer`` in a child process; ``url`` is its base URL (``.../v1`` is the API)."""

    def __init__(self, *args: str) -> None:
        self.args = list(args)

    def __enter__(self) -> ReplayServerProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.replay_openai", *self.args],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self._process.kill()
            raise RuntimeError("the replay OpenAI server did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._process.terminate()
        self._process.wait(10)


class ServerScript:
    """The replay server's conversation cursor, shaped like ``ReplayScript`` for the benchmark's checks."""

    def __init__(self, url: str, client: Any) -> None:
        self.url = url
        self.replies = all_replies()
        self._client = client  # an httpx.Client, kept apart from the clients being measured

    def reset(self) -> None:
        self._client.post(f"{self.url}/reset", content=b"{}").raise_for_status()

    @property
    def cursor(self) -> int:
        return int(json.loads(self._client.get(f"{self.url}/cursor").content)["cursor"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reply", help="answer every request with this text instead of the conversation")
    args = parser.parse_args()
    if args.reply:
        usage = usage_block(USAGE["input_tokens"], USAGE["output_tokens"])
        server = ReplayOpenAIServer([chat_completion(content=args.reply, usage=usage, model=MODEL)], repeat=True)
    else:
        server = ReplayOpenAIServer(completions())
    with server:
        print(server.url, flush=True)
        server._thread.join()


if __name__ == "__main__":
    main()
