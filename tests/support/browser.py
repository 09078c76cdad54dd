"""Helpers for the browser tests: a static page on one loopback origin, ``picoflow serve`` on another.

* ``PageServer`` serves ``cors_page.html`` (and nothing else) from a thread of the test process;
* ``ApiServer`` runs ``python -m picoflow.local.cli serve --port 0`` as a subprocess with the TinyFlow flow,
  a scripted model and a SQLite session store, and always stops it;
* ``require_playwright`` returns ``sync_playwright``, skipping when Chromium or playwright is missing,
  except in CI (``CI=true``), where it fails instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.dynamodb_local import DUMMY_AWS_ENV

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path(__file__).resolve().parent / "cors_page.html"
SCREENSHOTS = ROOT / "ignore" / "screenshots"

#: Debian's ``chromium`` package; playwright drives it instead of a browser build of its own.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAUNCH_TIMEOUT_MS = 60_000
API_START_TIMEOUT_SECONDS = 60
API_STOP_TIMEOUT_SECONDS = 10
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_playwright() -> Callable[[], Any]:
    """``playwright.sync_api.sync_playwright``, or a skip (a failure in CI) saying what is missing."""
    missing = []
    sync_playwright = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing.append(f"the playwright module ({exc}; pip install -e '.[dev]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        reason = "browser test not run: missing " + " and ".join(missing)
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return sync_playwright


# -- the page's origin --------------------------------------------------------------------------------


class _PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/", "/index.html"):
            self.send_error(404)
            return
        body = PAGE.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
        pass


class PageServer:
    """The static page on ``http://127.0.0.1:<port>``, served from a daemon thread until ``stop``."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# -- the API's origin ---------------------------------------------------------------------------------


class ApiServer:
    """``picoflow serve`` in a subprocess; ``cors_allow_origin=None`` leaves ``CORS_ALLOW_ORIGIN`` unset.

    ``replies`` are the scripted model's: a text, or a whole reply (``{"content", "tool_calls", "usage"}``);
    None serves the flows' own providers instead. ``flows`` are the modules it registers, ``env`` more variables.
    """

    def __init__(
        self,
        workdir: Path,
        replies: list[str] | list[str | dict[str, Any]] | None,
        cors_allow_origin: str | None,
        *,
        flows: str = "tests.support.tiny_flow",
        env: dict[str, str] | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.sqlite_path = workdir / "sessions.sqlite"
        extra = dict(env or {})
        if replies is not None:
            script = workdir / "script.json"
            script_replies = [reply if isinstance(reply, dict) else {"content": reply} for reply in replies]
            script.write_text(json.dumps(script_replies), encoding="utf-8")
            extra["PICOFLOW_SCRIPT"] = str(script)
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("CORS_", "PICOFLOW_", "FILES_"))
        }
        env.update(DUMMY_AWS_ENV)
        env.update(
            SESSION_STORE="SQLITE",
            SQLITE_PATH=str(self.sqlite_path),
            PICOFLOW_FLOWS=flows,
            FILES_FOLDER=str(workdir / "uploads"),
            POWERTOOLS_METRICS_DISABLED="true",
            POWERTOOLS_LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
            **extra,
        )
        if cors_allow_origin is not None:
            env["CORS_ALLOW_ORIGIN"] = cors_allow_origin
        self._stdout_path = workdir / "serve.stdout"
        self._stderr_path = workdir / "serve.stderr"
        with self._stdout_path.open("wb") as stdout, self._stderr_path.open("wb") as stderr:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "picoflow.local.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        try:
            self.url = self._wait_for_url()
        except BaseException:
            self.stop()
            raise

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + API_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            match = _LISTENING.search(self._stdout_path.read_text(encoding="utf-8", errors="replace"))
            if match:
                return match.group(1)
            if self._process.poll() is not None:
                raise RuntimeError(f"picoflow serve exited with {self._process.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise RuntimeError(f"picoflow serve did not listen within {API_START_TIMEOUT_SECONDS} s:\n{self.output()}")

    def output(self) -> str:
        """What the server printed so far (stdout, then its access log and errors)."""
        read = [path.read_text(encoding="utf-8", errors="replace") for path in (self._stdout_path, self._stderr_path)]
        return "\n".join(read)

    def stored_sessions(self) -> dict[str, dict[str, Any]]:
        """The session documents in the server's SQLite file, by id."""
        if not self.sqlite_path.exists():
            return {}
        conn = sqlite3.connect(self.sqlite_path, timeout=5)
        try:
            tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'session'").fetchall()
            rows = conn.execute("SELECT id, doc FROM session").fetchall() if tables else []
        finally:
            conn.close()
        return {session_id: json.loads(doc) for session_id, doc in rows}

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=API_STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=API_STOP_TIMEOUT_SECONDS)


@contextlib.contextmanager
def launched_chromium() -> Iterator[Any]:
    """Debian's Chromium under playwright, with the flags this machine needs; skipped (or failed in CI) without it."""
    sync_playwright = require_playwright()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=LAUNCH_TIMEOUT_MS)
        try:
            yield chromium
        finally:
            chromium.close()
