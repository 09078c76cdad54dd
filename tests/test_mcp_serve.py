"""MCP through the Lambda handler: ``picoflow serve`` processes whose flows reach MCP servers in other processes.

HotelFlow's whole bundled conversation runs with its search on ``flows/hotel/mcp_server.py`` over streamable HTTP
and again over stdio; a keyed turn whose server is frozen answers the retryable code before the Lambda deadline,
and its retry after the server thaws is applied once.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from flows.hotel import booking
from picoflow.errors import public_message
from picoflow.session.sqlite_store import SQLiteSessionStore
from tests.support.mcp_servers import ROOT, HttpServer

CONVERSATION = json.loads((ROOT / "flows" / "hotel" / "conversation.json").read_text(encoding="utf-8"))
LAMBDA_TIMEOUT_SECONDS = 6
_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class Serve:
    """One ``picoflow serve`` process on a free port, with a scripted model and an SQLite store."""

    def __init__(self, tmp: Path, script: list[dict[str, Any]], env: dict[str, str]) -> None:
        self.db = tmp / "sessions.sqlite"
        self.log = tmp / "serve.log"
        script_path = tmp / "script.json"
        script_path.write_text(json.dumps(script))
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("AWS_", "OPENAI_", "PICOFLOW_", "SESSION_", "HOTEL_MCP", "MCP_TEST"))}
        environ.update({
            "PYTHONPATH": str(ROOT), "SESSION_STORE": "SQLITE", "SQLITE_PATH": str(self.db),
            "PICOFLOW_SCRIPT": str(script_path), "POWERTOOLS_METRICS_DISABLED": "true", **env,
        })
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "picoflow.local.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
                cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        self.port = 0
        deadline = time.monotonic() + 30
        while not self.port and time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text(errors="replace")
            match = _LISTENING.search(self.log.read_text(errors="replace"))
            self.port = int(match.group(1)) if match else 0
            time.sleep(0.05)
        assert self.port, f"serve did not start:\n{self.log.read_text(errors='replace')}"

    def run(self, flow: str, message: str, session: str | None = None, key: str | None = None,
            config: dict[str, Any] | None = None) -> tuple[int, dict[str, str], dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if session:
            headers["CHAT_SESSION_ID"] = session
        if key:
            headers["Idempotency-Key"] = key
        body = {"flowName": flow, "message": message, **({"config": config} if config else {})}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("POST", "/ai/run", body=json.dumps(body), headers=headers)
            response = connection.getresponse()
            raw = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(raw)
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stored(self, session: str) -> dict[str, Any]:
        async def load() -> dict[str, Any]:
            store = SQLiteSessionStore(str(self.db))
            try:
                return (await store.load(session)).to_json_dict()
            finally:
                await store.close()

        return asyncio.run(load())


def run_conversation(serve: Serve) -> tuple[str, dict[str, Any]]:
    session = None
    body: dict[str, Any] = {}
    for turn in CONVERSATION["turns"]:
        status, _, body = serve.run("HotelFlow", turn["user"], session, config=CONVERSATION["config"])
        assert status == 200, f"{turn['user']}: {body}\n{serve.log.read_text(errors='replace')[-3000:]}"
        session = body["session"]
    assert session is not None
    return session, body


def hotel_script() -> list[dict[str, Any]]:
    return [reply for turn in CONVERSATION["turns"] for reply in turn.get("replies", [])]


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_hotelflow_conversation_searches_through_the_mcp_server(transport: str, tmp_path: Path) -> None:
    server = None
    if transport == "http":
        server = HttpServer("flows.hotel.mcp_server", tmp_path / "hotel-mcp.log").start()
        env = {"HOTEL_MCP_URL": server.url}
    else:
        env = {"HOTEL_MCP_COMMAND": f"{sys.executable} -m flows.hotel.mcp_server"}
    serve = Serve(tmp_path, hotel_script(), {"PICOFLOW_FLOWS": "flows.hotel", **env})
    try:
        session, last = run_conversation(serve)
    finally:
        serve.stop()
        if server is not None:
            server.stop()
    assert last["completed"] is True
    assert booking.confirmation_number(session, "Hilton Garden Inn Wilsonville Portland") in last["message"]
    if server is not None:
        # Every turn that shows results searched again on the separate server: the searches went there.
        assert server.log.read_text(errors="replace").count('"POST /mcp HTTP/1.1" 200') >= 8


def test_a_frozen_server_answers_the_retryable_code_before_the_lambda_deadline_and_the_retry_applies_once(
    tmp_path: Path,
) -> None:
    server = HttpServer("tests.support.mcp_test_server", tmp_path / "mcp.log").start()
    script = [{"content": "hi"}] + [
        {"content": "", "tool_calls": [{"name": "sum_numbers", "args": {"a": 1, "b": 2}, "id": f"c{n}"}]}
        for n in range(2)
    ]
    serve = Serve(tmp_path, script, {
        "PICOFLOW_FLOWS": "tests.support.mcp_flow", "MCP_TEST_URL": server.url, "MCP_TEST_TIMEOUT": "30",
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(LAMBDA_TIMEOUT_SECONDS),
    })
    try:
        status, _, opened = serve.run("McpFlow", "hello")
        assert status == 200, opened
        session = opened["session"]
        before = serve.stored(session)

        server.freeze()
        key = f"key-{uuid.uuid4().hex}"
        started = time.monotonic()
        status, headers, body = serve.run("McpFlow", "add 1 and 2", session, key)
        elapsed = time.monotonic() - started
        assert elapsed < LAMBDA_TIMEOUT_SECONDS, f"answered after {elapsed:.2f} s"
        assert (status, body["code"], body["message"]) == (503, "MCP_UNAVAILABLE", public_message("MCP_UNAVAILABLE"))
        assert headers["retry-after"] == "5"
        assert "127.0.0.1" not in json.dumps(body) and "mcp" not in body["message"].lower()
        assert serve.stored(session) == before, "the failed turn left the session unchanged"

        server.thaw()
        status, headers, retried = serve.run("McpFlow", "add 1 and 2", session, key)
        assert status == 200 and retried["message"].startswith("backend total 3 from "), retried
        assert "idempotent-replayed" not in headers
        status, headers, replayed = serve.run("McpFlow", "add 1 and 2", session, key)
        assert status == 200 and headers.get("idempotent-replayed") == "true"
        assert replayed["message"] == retried["message"]
        doc = serve.stored(session)
        assert doc["revision"] == before["revision"] + 1
        assert json.dumps(doc["flow"]["memory"]).count("add 1 and 2") == 1
    finally:
        serve.stop()
        server.stop()
