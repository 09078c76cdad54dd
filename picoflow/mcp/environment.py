"""Where a flow finds its MCP server: a URL, else a command, else the server module shipped with the flow.

One declaration serves every place a flow runs: deployed, the environment names a streamable HTTP server and the
SSM parameter holding its Authorization header; on a laptop or in tests, nothing is set and the flow's own server
module runs as a stdio subprocess, started from the folder that holds the flow's package.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from picoflow.mcp import MCPServerSpec


def package_root(module: str) -> str:
    """The folder a dotted ``module`` is imported from: the one holding its top-level package (or the module).

    Found without importing anything; a module that cannot be found raises ``ModuleNotFoundError``.
    """
    top = module.split(".", 1)[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {top!r}", name=top)
    if spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)
    assert spec.origin is not None  # a found plain module has a file
    return str(Path(spec.origin).resolve().parent)


def server_from_env(name: str, prefix: str, bundled_module: str, *, timeout: float,
                    max_result_bytes: int | None = None) -> MCPServerSpec:
    """``{prefix}_URL`` (streamable HTTP), else ``{prefix}_COMMAND`` (stdio), else ``python -m bundled_module``.

    Over HTTP, the Authorization header is the SSM parameter named by ``{prefix}_AUTHORIZATION_PARAMETER`` when
    that is set (the deployed way), else the value of ``{prefix}_AUTHORIZATION``. A command runs in
    ``{prefix}_CWD`` (default: the folder holding ``bundled_module``'s package, see :func:`package_root`) and also
    gets the variables named, comma-separated, in ``{prefix}_INHERIT_ENV`` (say ``NODE_OPTIONS``), and ``TZ``
    always; ``max_result_bytes`` (None: the default) caps its answers. A flow in package ``hotel`` passes
    ``f"{__package__}.mcp_server"``, so the same code serves wherever the package is.
    """
    from picoflow.mcp import DEFAULT_MAX_RESULT_BYTES, MCPServerSpec  # here: a server module may import this one

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
    root = package_root(bundled_module)
    inherited = [variable.strip() for variable in os.environ.get(f"{prefix}_INHERIT_ENV", "").split(",")]
    # A stdio server gets a minimal environment: the path lets a Python server import the application, and the
    # time zone is passed on because a server may read dates in it (the original hotel-pricing server does).
    return MCPServerSpec.stdio(
        name, command[0], command[1:], env={"PYTHONPATH": root},
        inherit_env=list(dict.fromkeys(["TZ", *(v for v in inherited if v)])),
        cwd=os.environ.get(f"{prefix}_CWD") or root, timeout=timeout, max_result_bytes=limit,
    )
