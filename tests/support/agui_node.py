"""The AG-UI project's own TypeScript client (``@ag-ui/client``'s ``HttpAgent``), run under node by the tests.

The npm package is installed once into ``<repo>/.cache/ag-ui-client-<version>/`` (as the DynamoDB Local jar is);
``run_http_agent`` drives ``agui_client.cjs`` with it and returns what the agent saw. Without node or npm the
tests that need it skip with the reason, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
PACKAGE = "@ag-ui/client"
VERSION = "1.0.0"
SCRIPT = Path(__file__).resolve().parent / "agui_client.cjs"


def require_node() -> None:
    """Skip (fail in CI) when node or npm is missing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        reason = f"AG-UI client tests not run: {' and '.join(missing)} not on PATH"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def ensure_client(cache_dir: Path = CACHE_DIR) -> Path:
    """The folder whose ``node_modules`` holds ``@ag-ui/client``, installing it on first use."""
    require_node()
    install_dir = cache_dir / f"ag-ui-client-{VERSION}"
    if (install_dir / "node_modules" / "@ag-ui" / "client" / "package.json").exists():
        return install_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".ag-ui-lock", "w") as lock:
        # Several test processes may start at once: only one of them installs.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (install_dir / "node_modules" / "@ag-ui" / "client" / "package.json").exists():
            return install_dir
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=cache_dir))
        try:
            result = subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(staging), f"{PACKAGE}@{VERSION}"],
                capture_output=True, text=True, timeout=600,
            )
            if result.returncode != 0:
                raise RuntimeError(f"npm install {PACKAGE}@{VERSION} failed: {result.stderr.strip()[-2000:]}")
            staging.rename(install_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return install_dir


def run_http_agent(url: str, thread_id: str, runs: list[dict[str, Any]], headers: dict[str, str] | None = None,
                   timeout: float = 120) -> list[dict[str, Any]]:
    """Drive an ``HttpAgent`` at ``url`` through ``runs`` on one thread; what it saw in each run.

    A run is ``{"message": text}`` (a user message added before it), optionally ``"history"`` (the agent's messages
    replaced first, as a client that altered its copy would) and ``"resume"`` (the run's resume entries) or
    ``"resumeAll"`` (a payload resolving every interrupt the previous run ended with).
    Each result holds the event ``types``, its ``TOOL_CALL_*`` events (``tools``), the run's ``result``, the
    ``outcome``/``interrupts`` of RUN_FINISHED, the agent's ``messages`` and ``state`` afterwards, and ``error`` when
    the run failed.
    """
    install_dir = ensure_client()
    config = {"url": url, "threadId": thread_id, "runs": runs, "headers": headers or {}, "modules": str(install_dir)}
    result = subprocess.run(["node", str(SCRIPT), json.dumps(config)], capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"the AG-UI client failed: {result.stderr[-3000:]}")
    outcome: list[dict[str, Any]] = json.loads(result.stdout)
    return outcome
