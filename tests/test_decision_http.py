"""DecisionSteps over HTTP: the real Lambda handler behind the local server, the engine built from the environment."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import handlers.api
from picoflow.aws import runtime as aws_runtime
from picoflow.local.serve import make_server

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


def route(label: str) -> dict[str, Any]:
    """A scripted chat model's estimates for the router's one question, favouring ``label``."""
    estimates = {name: 0.05 for name in ("review", "notice", "search")}
    estimates[label] = 0.9
    return {"content": json.dumps({"route": estimates}), "usage": {"input_tokens": 30, "output_tokens": 6}}


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Starts ``picoflow serve``'s server on the project's handler, with the environment given."""
    servers = []

    def start(flows: str, script: list[Any], **environ: str) -> str:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(script))
        monkeypatch.setenv("SESSION_STORE", "MEMORY")
        monkeypatch.setenv("PICOFLOW_FLOWS", flows)
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        server = make_server("127.0.0.1", 0, handlers.api.lambda_handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def run(url: str, flow: str, message: str, session: str | None = None) -> tuple[int, dict[str, Any]]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Content-Type": "application/json", **({"CHAT_SESSION_ID": session} if session else {})}
    try:
        conn.request("POST", "/ai/run", json.dumps({"flowName": flow, "message": message}), headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def stored(session: str) -> dict[str, Any]:
    doc = aws_runtime.read_session(session)
    assert doc is not None
    return doc


def router_state(doc: dict[str, Any]) -> dict[str, Any]:
    return next(step for step in doc["flow"]["steps"] if step["name"] == "RouterStep")["state"]


def test_a_decision_step_answers_and_keeps_the_cursor_turn_after_turn(serve):
    url = serve("tests.support.decision_flows",
                [route("review"), route("notice"), route("search"), {"content": "Hotel Lutetia, 180 EUR."}])

    status, first = run(url, "RouterFlow", "What have I saved so far?")
    assert (status, first["success"], first["completed"]) == (200, True, False)
    assert first["message"] == "Saved criteria: Paris, 2 nights (decision 1)."
    session = first["session"]
    doc = stored(session)
    assert (doc["runStatus"], doc["flow"]["currentStep"]) == ("running", "RouterStep")

    # The cursor stayed on the router, so the next turn is decided again, there, with direct(text) this time.
    status, second = run(url, "RouterFlow", "Any news?", session)
    assert (status, second["session"], second["message"]) == (200, session, "No news yet (decision 2).")
    doc = stored(session)
    assert (doc["runStatus"], doc["flow"]["currentStep"]) == ("running", "RouterStep")
    assert router_state(doc)["requests"] == ["What have I saved so far?", "Any news?"]

    status, third = run(url, "RouterFlow", "Search now", session)
    assert (status, third["message"]) == (200, "Hotel Lutetia, 180 EUR.")
    doc = stored(session)
    assert doc["flow"]["currentStep"] == "SearchStep"
    assert [item["stepName"] for item in doc["flow"]["sequence"]] == ["RouterStep", "SearchStep"]
