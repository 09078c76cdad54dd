"""Start real MCP servers as separate processes for the tests: on a free loopback port, or over stdio."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from picoflow import FlowEngine
from picoflow.mcp import MCPSessions

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HttpServer:
    """``python -m MODULE --http --port N`` in its own process (``env`` added to ours); ``url`` is its endpoint."""

    def __init__(self, module: str, log: Path, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.module = module
        self.env = env or {}
        self.log = log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "--http", "--port", str(self.port)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.module} exited:\n{self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.module} did not listen on {self.port} within {START_TIMEOUT_SECONDS} s")

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)


class OpenedSessions:
    """The MCP sessions a test module opens: ``direct`` for tool calls made without an engine, and those of every
    engine it keeps; ``close`` ends them all (stdio servers exit) after each test."""

    def __init__(self) -> None:
        self.direct = MCPSessions()
        self._engines: list[FlowEngine] = []

    def kept(self, engine: FlowEngine) -> FlowEngine:
        self._engines.append(engine)
        return engine

    async def close(self) -> None:
        await self.direct.close()
        while self._engines:
            await self._engines.pop().mcp.close()
