"""DecisionSteps over HTTP: the real Lambda handler behind the local server, the engine built from the environment."""

from __future__ import annotations

import http.client
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import handlers.api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.aws.discovery import DECISION_PROVIDERS_VARIABLE, load_decision_providers
from picoflow.errors import PicoFlowError
from picoflow.local.cli import main
from picoflow.local.serve import LambdaHTTPServer, make_server
from tests.support.decision_flows import HANDOFF
from tests.support.keyword_decisions import READY, KeywordDecider

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


def route(label: str) -> dict[str, Any]:
    """A scripted chat model's estimates for the router's one question, favouring ``label``."""
    estimates = {name: 0.05 for name in ("review", "notice", "search")}
    estimates[label] = 0.9
    return {"content": json.dumps({"route": estimates}), "usage": {"input_tokens": 30, "output_tokens": 6}}


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Sets the environment the container's engine is built from, on its next use."""

    def configure(flows: str, script: list[Any], **environ: str) -> None:
        path = tmp_path / "script.json"
        path.write_text(json.dumps(script))
        monkeypatch.setenv("SESSION_STORE", "MEMORY")
        monkeypatch.setenv("PICOFLOW_FLOWS", flows)
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        monkeypatch.setenv(DECISION_PROVIDERS_VARIABLE, "")
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(aws_runtime, "_runtime", None)

    yield configure
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


@pytest.fixture
def serve(environment: Callable[..., None]) -> Iterator[Callable[..., str]]:
    """Starts ``picoflow serve``'s server on the project's handler, with the environment given."""
    servers = []

    def start(flows: str, script: list[Any], **environ: str) -> str:
        environment(flows, script, **environ)
        server = make_server("127.0.0.1", 0, handlers.api.lambda_handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


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


def test_a_decision_service_outage_is_handed_off_from_the_router_which_keeps_the_cursor(serve):
    script = [
        {"for": "decision", "delay": 2, **route("search")},  # past the router's 300 ms timeout
        {"for": "decision", "error": "decision service down", "status": 500},
        {"for": "decision", "content": "not the requested structure"},
        {"for": "decision", **route("notice")},
    ]
    url = serve("tests.support.decision_flows", script)

    status, first = run(url, "GuardedRouterFlow", "Where is my refund?")
    session = first["session"]
    for message in ("Any update?", "Hello?"):
        assert (status, first["success"], first["message"]) == (200, True, HANDOFF)
        doc = stored(session)
        assert (doc["runStatus"], doc["flow"]["currentStep"]) == ("running", "GuardedRouterStep")
        status, first = run(url, "GuardedRouterFlow", message, session)
    assert (status, first["message"]) == (200, HANDOFF)

    status, last = run(url, "GuardedRouterFlow", "Any news now?", session)
    assert (status, last["message"]) == (200, "No news yet (decision 1).")
    doc = stored(session)
    assert (doc["runStatus"], doc["flow"]["currentStep"], doc["error"]) == ("running", "GuardedRouterStep", [])
    state = next(step for step in doc["flow"]["steps"] if step["name"] == "GuardedRouterStep")["state"]
    assert state["unavailable"] == ["TimeoutError", "ScriptedModelError", "DecisionValidationError"]


# -- a decision provider chosen by configuration -------------------------------------------------------


FACTORY = "keywords=tests.support.keyword_decisions:make_decider"


def test_picoflow_serve_uses_the_decision_provider_the_environment_names(serve):
    KeywordDecider.built.clear()
    url = serve("tests.support.keyword_decisions", [{"content": "Hotel Lutetia, 180 EUR."}],
                **{DECISION_PROVIDERS_VARIABLE: FACTORY})

    status, first = run(url, "KeywordRouterFlow", "What have I saved so far?")
    assert (status, first["message"]) == (200, "Saved criteria: Paris, 2 nights (decision 1).")
    status, second = run(url, "KeywordRouterFlow", "Search please", first["session"])
    assert (status, second["message"]) == (200, "Hotel Lutetia, 180 EUR.")  # the only scripted chat reply

    (decider,) = KeywordDecider.built  # built once, by the factory, with the environment
    assert decider.spec == FACTORY
    assert [(r.selection.provider, r.selection.name, r.timeout_ms) for r in decider.requests] == [
        ("keywords", "rules-v1", 2000)] * 2
    usage = stored(first["session"])["decisionUsage"]
    assert (usage["calls"], usage["totalTokens"]) == (2, 16)


def test_the_lambda_handler_uses_the_decision_provider_the_environment_names(environment):
    READY.requests.clear()
    environment("tests.support.keyword_decisions", [],
                **{DECISION_PROVIDERS_VARIABLE: "keywords=tests.support.keyword_decisions:READY"})

    event = http_event("POST", "/ai/run", body={"flowName": "KeywordRouterFlow", "message": "Show my criteria"})
    result = handlers.api.lambda_handler(event, FakeLambdaContext())

    assert result["statusCode"] == 200, result["body"]
    assert json.loads(result["body"])["message"] == "Saved criteria: Paris, 2 nights (decision 1)."
    assert [r.state["request"] for r in READY.requests] == ["Show my criteria"]


def test_the_serve_command_passes_decision_providers_on(monkeypatch):
    monkeypatch.setenv(DECISION_PROVIDERS_VARIABLE, "placeholder")  # so the variable is restored afterwards
    monkeypatch.delenv(DECISION_PROVIDERS_VARIABLE)
    monkeypatch.setenv("SESSION_STORE", "MEMORY")

    def interrupted(self, poll_interval=0.5):
        raise KeyboardInterrupt

    monkeypatch.setattr(LambdaHTTPServer, "serve_forever", interrupted)
    assert main(["serve", "--port", "0", "--no-inspector", "--decision-providers", FACTORY]) == 0
    assert os.environ[DECISION_PROVIDERS_VARIABLE] == FACTORY


@pytest.mark.parametrize(("spec", "problem"), [
    ("keywords", "'keywords' is not name=module:attribute"),
    ("keywords=tests.support.keyword_decisions", "is not name=module:attribute"),
    ("keywords=tests.support.keyword_decisions:missing", "has no 'missing'"),
    ("keywords=tests.support.decision_flows:ROUTE", "neither a decision provider"),
    ("keywords=tests.support.keyword_decisions:KeywordRouterFlow", "the factory .* raised TypeError"),
    (f"{FACTORY},{FACTORY}", "'keywords' twice"),
])
def test_a_wrong_decision_provider_setting_is_a_clear_error(spec: str, problem: str):
    with pytest.raises(PicoFlowError, match=f"{DECISION_PROVIDERS_VARIABLE}.*{problem}"):
        load_decision_providers(spec, {})


def test_no_setting_registers_no_decision_provider():
    assert load_decision_providers(None, {}) == {} == load_decision_providers(" , ", {})
