"""Run an application's own MCP server from the command line: stdio by default, streamable HTTP on request.

A server module ends with ``run_tool_server(build_server, "what it serves", port=8765)`` under
``if __name__ == "__main__"``; ``python -m package.server`` then serves stdio (the way a flow starts it through
:func:`picoflow.mcp.environment.server_from_env`), and ``--http [--host H] [--port N]`` serves ``/mcp`` over HTTP.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def run_tool_server(build_server: Callable[[], Any], description: str, *, port: int,
                    argv: list[str] | None = None) -> None:
    """Serve ``build_server()`` (an SDK ``MCPServer``) over stdio, or over streamable HTTP with ``--http``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    options = parser.parse_args(argv)
    server = build_server()
    if options.http:
        server.run("streamable-http", host=options.host, port=options.port)
    else:
        server.run("stdio")
