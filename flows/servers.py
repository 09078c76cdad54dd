"""The example flows' MCP servers: where a flow finds one (a URL, else a command, else the server bundled with the
flow), and how a bundled server runs from the command line."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from picoflow.mcp import MCPServerSpec

#: The directory holding ``flows/`` (the repository, or the Lambda function's code): a bundled server imports from it.
APP_ROOT = str(Path(__file__).resolve().parent.parent)


def server_from_env(name: str, prefix: str, bundled_module: str, *, timeout: float,
                    max_result_bytes: int | None = None) -> MCPServerSpec:
    """``{prefix}_URL`` (streamable HTTP), else ``{prefix}_COMMAND`` (stdio), else ``python -m bundled_module``.

    Over HTTP, the Authorization header is the SSM parameter named by ``{prefix}_AUTHORIZATION_PARAMETER`` when
    that is set (the deployed way), else the value of ``{prefix}_AUTHORIZATION``. A command runs in
    ``{prefix}_CWD`` (default: the folder holding ``flows/``) and also gets the variables named, comma-separated,
    in ``{prefix}_INHERIT_ENV`` (say ``NODE_OPTIONS``), and ``TZ`` always; ``max_result_bytes`` (None: the
    default) caps its answers.
    """
    from picoflow.mcp import DEFAULT_MAX_RESULT_BYTES, MCPServerSpec  # here: a bundled server imports this too

    limit = max_result_bytes or DEFAULT_MAX_RESULT_BYTES
    url = os.environ.get(f"{prefix}_URL")
    if url:
        parameter = os.environ.get(f"{prefix}_AUTHORIZATION_PARAMETER")
        if parameter:
            return MCPServerSpec.http(name, url, headers_from_ssm={"Authorization": parameter},
                                      timeout=timeout, max_result_bytes=limit)
        return MCPServerSpec.http(name, url, headers_from_env={"Authorization": f"{prefix}_AUTHORIZATION"},
                                  timeout=timeout, max_result_bytes=limit)
    command = shlex.split(os.environ.get(f"{prefix}_COMMAND") or "")
    if not command:
        command = [sys.executable, "-m", bundled_module]
    inherited = [variable.strip() for variable in os.environ.get(f"{prefix}_INHERIT_ENV", "").split(",")]
    # A stdio server gets a minimal environment: the path lets a Python server import the application, and the
    # time zone is passed on because a server may read dates in it (the original hotel-pricing server does).
    return MCPServerSpec.stdio(
        name, command[0], command[1:], env={"PYTHONPATH": APP_ROOT},
        inherit_env=list(dict.fromkeys(["TZ", *(v for v in inherited if v)])),
        cwd=os.environ.get(f"{prefix}_CWD") or APP_ROOT, timeout=timeout, max_result_bytes=limit,
    )


def run_bundled_server(build_server: Callable[[], Any], description: str, *, port: int,
                       argv: list[str] | None = None) -> None:
    """Serve ``build_server()`` over stdio, or over streamable HTTP with ``--http [--host H] [--port N]``."""
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
