"""A real MCP server for the tests: structured and text results, a failing, a slow and an unlisted-for-the-model tool.

``python -m tests.support.mcp_test_server`` serves over stdio, ``--http --port N`` over streamable HTTP; with
``MCP_TEST_AUTHORIZATION`` set, the HTTP server answers 401 to any request without exactly that Authorization.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

#: Text the failing tool raises with: it must never reach a response or a log message.
SECRET = "SECRET-UPSTREAM-TEXT at http://internal.example/hidden"

server = MCPServer("picoflow-test")
_calls: dict[str, int] = {}


class Sum(BaseModel):
    total: int
    pid: int


class Calls(BaseModel):
    counts: dict[str, int]


def _count(name: str) -> None:
    _calls[name] = _calls.get(name, 0) + 1


@server.tool()
def add(a: int, b: int) -> Sum:
    """Add two integers."""
    _count("add")
    return Sum(total=a + b, pid=os.getpid())


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    _count("fail")
    raise ValueError(SECRET)


@server.tool()
def slow(seconds: float) -> str:
    """Answers after ``seconds``."""
    _count("slow")
    time.sleep(seconds)
    return "late"


@server.tool(structured_output=False)
def big(chars: int) -> str:
    """A text result of ``chars`` characters."""
    _count("big")
    return "x" * chars


@server.tool()
def hidden() -> str:
    """A tool no step offers."""
    _count("hidden")
    return "should never run"


@server.tool()
def calls() -> Calls:
    """How often each tool ran in this process."""
    return Calls(counts=dict(_calls))


def require_authorization(app: Any, expected: str) -> Any:
    """``app`` behind a check of the Authorization header (an ASGI wrapper; lifespan events pass through)."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected.encode():
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    required = os.environ.get("MCP_TEST_AUTHORIZATION")
    if options.http and required:
        import uvicorn

        uvicorn.run(require_authorization(server.streamable_http_app(), required), host="127.0.0.1",
                    port=options.port, log_level="warning")
    elif options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.port)
    else:
        server.run("stdio")
