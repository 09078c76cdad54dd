"""Tool calls waiting for a person, as ``picoflow serve`` shows them: the chat page's approval cards and the
inspector's approvals panel.

* without a browser: ``GET /ai/tools`` (the descriptions the cards show) and ``GET /ai/session`` carrying the
  approvals, pending then decided, with who decided, when and why;
* in headless Chromium: a refund the user approves (the tool runs once, the model's answer is shown, the buttons
  stay disabled), one the user denies with a reason, and a goodwill credit that waits for a reviewer without
  buttons; the inspector lists all three. Screenshots go to ``ignore/screenshots/``.
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from picoflow.authoring.step import Step
from picoflow.aws import runtime as aws_runtime
from picoflow.local.chat import chat
from picoflow.local.inspector import Inspector
from picoflow.local.serve import make_server
from picoflow.local.tool_catalog import cached, tool_catalog
from picoflow.session.document import SessionDoc
from tests.support.approval_desk import NAMESPACE, DeskFlow
from tests.support.browser import SCREENSHOTS, ApiServer, launched_chromium
from tests.support.tiny_flow import TinyFlow

FLOWS = "tests.support.approval_desk"
PAGE_TIMEOUT_MS = 30_000
REFUND_DESCRIPTION = "Refund an order to the customer's card."


def refund(order: str, amount: float, content: str, tool: str = "refund") -> dict[str, Any]:
    """A scripted model reply that calls ``tool`` on ``order``."""
    return {"content": content, "tool_calls": [{"name": tool, "args": {"order": order, "amount": amount},
                                                 "id": f"call-{order}"}]}


def request(url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


# -- without a browser --------------------------------------------------------------------------------


def test_the_catalog_names_each_flows_tools_and_leaves_out_flows_that_need_a_request() -> None:
    class NeedsConfig(DeskFlow):
        def define_steps(self) -> list[Step]:
            raise KeyError("config")  # e.g. steps read from the request's config

    catalog = tool_catalog([DeskFlow, TinyFlow, NeedsConfig])
    assert catalog == {
        "DeskFlow": {"refund": REFUND_DESCRIPTION, "goodwill": "Pay goodwill credit on an order."},
        "TinyFlow": {},
    }
    reads: list[int] = []
    once = cached(lambda: reads.append(1) or catalog)  # type: ignore[func-returns-value]
    assert once() == once() == catalog and reads == [1]


@pytest.fixture
def desk_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``picoflow.aws.api`` with a fresh engine: the refund desk, a scripted model and the in-memory store."""
    script = tmp_path / "script.json"
    replies = [refund("A1", 42.5, "Once you approve."), {"content": "Refunded."},
               refund("B2", 10, "Waiting for you."), {"content": "Not refunded."}]
    script.write_text(json.dumps(replies), encoding="utf-8")
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("PICOFLOW_FLOWS", FLOWS)
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield
    runtime = aws_runtime._runtime
    if runtime is not None:
        runtime.loop.call_soon_threadsafe(runtime.loop.stop)


@pytest.fixture
def start_server() -> Iterator[Callable[..., str]]:
    servers = []

    def start(**options: Any) -> str:
        options.setdefault("handler", "picoflow.aws.api:lambda_handler")
        server = make_server("127.0.0.1", 0, **options)
        server.access_log = False
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run(url: str, body: dict[str, Any], session: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", **({"CHAT_SESSION_ID": session} if session else {})}
    status, _, payload = request(url, "POST", "/ai/run", headers, json.dumps(body).encode())
    assert status == 200, payload
    answer: dict[str, Any] = json.loads(payload)
    return answer


def read_session(url: str, session: str) -> dict[str, Any]:
    status, headers, payload = request(url, "GET", "/ai/session", {"CHAT_SESSION_ID": session})
    assert status == 200 and headers["Content-Type"] == "application/json", payload
    doc: dict[str, Any] = json.loads(payload)
    return doc


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_local_routes_give_the_tools_and_the_sessions_approvals(desk_handler, start_server):
    url = start_server(inspector=True)
    status, headers, payload = request(url, "GET", "/ai/tools")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(payload)["DeskFlow"]["refund"] == REFUND_DESCRIPTION

    paused = run(url, {"flowName": "DeskFlow", "message": "refund A1"})
    [pending] = paused["pendingApprovals"]
    assert (pending["tool"], pending["arguments"], pending["approver"]) == ("refund", {"order": "A1", "amount": 42.5},
                                                                            "user")
    [waiting] = read_session(url, paused["session"])["approvals"]
    assert waiting["id"] == pending["id"] and waiting["status"] == "pending"
    assert waiting["calls"] == [{"name": "refund", "args": {"order": "A1", "amount": 42.5}}]
    assert waiting["expiresAt"] == pending["expiresAt"] and "decidedAt" not in waiting

    decided = run(url, {"flowName": "DeskFlow", "approvals": [{"id": pending["id"], "approved": True}]},
                  paused["session"])
    assert decided["success"] and decided["message"] == "Refunded." and "pendingApprovals" not in decided
    [record] = read_session(url, paused["session"])["approvals"]
    assert (record["status"], record["settled"]) == ("approved", True)
    assert record["decidedAt"] >= record["createdAt"]


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_without_a_catalog_the_tools_route_is_left_to_the_handler(start_server):
    url = start_server(inspector=Inspector(None))
    assert request(url, "GET", "/ai/tools")[0] == 404


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_terminal_chat_prints_waiting_calls_and_sends_approve_and_deny(desk_handler, start_server):
    url = start_server()
    script = "/approve\nPlease refund A1\n/approve\nAnd B2\n/approve nonsense\n/deny wrong order\n/deny\n"
    out = io.StringIO()
    assert chat("DeskFlow", url, stdin=io.StringIO(script), stdout=out) == 0
    text = out.getvalue()
    assert text.count("[no call is waiting for your decision]") == 2  # before the first turn, and at the end
    assert '[waiting for your decision: refund {"order": "A1", "amount": 42.5} (ap_' in text
    assert "DeskFlow> Refunded." in text
    assert "[/approve takes no reason]" in text
    assert "DeskFlow> Not refunded." in text
    runtime = aws_runtime.get_runtime()
    [session] = {line.split()[1].rstrip("]") for line in text.splitlines() if line.startswith("[session ")}
    doc = runtime.call(runtime.engine.session_store.load(session))
    assert doc is not None
    assert [(a.status, a.reason) for a in doc.approvals] == [("approved", None), ("denied", "wrong order")]
    assert doc.flow.steps[0].state["refunds"] == ["A1"]


# -- the page in a browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture
def problems() -> list[str]:
    """Console errors and uncaught exceptions of the page."""
    return []


@pytest.fixture
def page(browser: Any, problems: list[str], request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: problems.append(f"console: {message.text}") if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
    try:
        yield page
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(SCREENSHOTS / f"approvals-{request.node.name}.png"), timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:  # a diagnostic only: never hide the test's own outcome
            warnings.warn(f"no screenshot: {exc}", stacklevel=1)
        context.close()


def say(page: Any, text: str, turn: int) -> None:
    """Type one message, send it, and wait until the reply and the inspector's refresh are in."""
    page.locator("#message").fill(text)
    page.press("#message", "Enter")
    page.wait_for_selector(f'body[data-turns="{turn}"][data-busy="false"]')


def card(page: Any, order: str) -> Any:
    return page.locator("#transcript li.approval").filter(has_text=f'"{order}"')


def test_the_user_approves_and_denies_in_the_page_and_a_reviewers_call_only_waits(page, tmp_path, problems):
    replies = [
        refund("A1", 42.5, "I will refund A1 once you approve it."),
        {"content": "Done: 42.50 is back on your card."},
        refund("B2", 10, "Waiting for your approval."),
        {"content": "Understood, B2 is not refunded."},
        refund("C3", 5, "A colleague will decide on the credit.", tool="goodwill"),
    ]
    api = ApiServer(tmp_path / "api", replies, None, flows=FLOWS)
    try:
        page.goto(f"{api.url}/?flow=DeskFlow", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector("body[data-ready=true]")

        # The model asks for a refund: a card with what the tool does, its exact arguments and two buttons.
        say(page, "Please refund order A1", 1)
        first = card(page, "A1")
        assert first.get_attribute("data-state") == "pending" and first.get_attribute("data-approver") == "user"
        page.wait_for_function("() => !document.querySelector('#transcript li.approval .tool-description').hidden")
        assert first.locator(".tool-description").text_content() == REFUND_DESCRIPTION
        assert first.locator(".tool-name").text_content() == "refund"
        assert json.loads(first.locator("pre.args").text_content()) == {"order": "A1", "amount": 42.5}
        assert first.locator("button.approve").is_enabled() and first.locator("button.deny").is_enabled()
        entry = page.locator('#approvals li[data-status="pending"]')
        assert entry.locator(".tool-name").text_content() == "refund"
        assert api.stored_sessions()[page_session(page)]["flow"]["steps"][0]["state"].get("refunds") is None

        # Approve: the decision is a turn of its own; the tool runs once and the model's answer is shown.
        first.locator("button.approve").click()
        page.wait_for_selector('body[data-turns="2"][data-busy="false"]')
        assert page.locator("#transcript li.note.error").count() == 0, api.output()
        assert "Done: 42.50 is back on your card." in page.locator("#transcript li.turn.bot").last.text_content()
        assert first.get_attribute("data-state") == "decided" and first.get_attribute("data-outcome") == "approved"
        assert first.locator("button.approve").is_disabled() and first.locator("button.deny").is_disabled()
        doc = api.stored_sessions()[page_session(page)]
        assert doc["flow"]["steps"][0]["state"]["refunds"] == ["A1"]
        assert [(a["status"], a["settled"]) for a in doc["approvals"]] == [("approved", True)]
        tool_results = [m["content"] for m in doc["flow"]["memory"][NAMESPACE]["messages"] if m["type"] == "tool"]
        assert tool_results.count("Refunded 42.50 on A1.") == 1

        # Deny, with a reason: the tool never runs and the reason is kept.
        say(page, "And refund B2", 3)
        second = card(page, "B2")
        second.locator("input.reason").fill("wrong order")
        second.locator("button.deny").click()
        page.wait_for_selector('body[data-turns="4"][data-busy="false"]')
        assert "Understood, B2 is not refunded." in page.locator("#transcript li.turn.bot").last.text_content()
        assert second.get_attribute("data-outcome") == "denied"
        assert second.locator("button.approve").is_disabled() and second.locator("input.reason").is_disabled()
        assert "wrong order" in second.locator(".outcome").text_content()
        doc = api.stored_sessions()[page_session(page)]
        assert doc["flow"]["steps"][0]["state"]["refunds"] == ["A1"]
        assert (doc["approvals"][1]["status"], doc["approvals"][1]["reason"]) == ("denied", "wrong order")

        # A reviewer's call: shown as waiting, nothing to click.
        say(page, "Some goodwill for C3?", 5)
        third = card(page, "C3")
        assert third.get_attribute("data-state") == "waiting" and third.locator("button").count() == 0
        assert "Waiting for a reviewer" in third.text_content()
        assert first.get_attribute("data-state") == "decided"  # earlier cards are not reopened

        # The inspector lists every approval: status, who decided, when, why, until when.
        entries = page.locator("#approvals li.approval-entry")
        assert entries.evaluate_all("items => items.map(i => i.dataset.status)") == ["approved", "denied", "pending"]
        denied = page.locator('#approvals li[data-status="denied"]')
        assert denied.locator('[data-fact="reason"]').text_content() == "wrong order"
        assert denied.locator('[data-fact="decidedBy"]').text_content() == "the user"
        assert denied.locator('[data-fact="decidedAt"]').text_content() == doc["approvals"][1]["decidedAt"]
        waiting = page.locator('#approvals li[data-status="pending"]')
        assert waiting.locator('[data-fact="approver"]').text_content() == "a reviewer"
        assert waiting.locator('[data-fact="decidedBy"]').text_content() == "—"
        assert waiting.locator('[data-fact="expiresAt"]').text_content() == \
            api.stored_sessions()[page_session(page)]["approvals"][2]["expiresAt"]

        # Reopened from the address, the page shows the call still waiting, and only that one.
        page.goto(f"{api.url}/?session={page_session(page)}", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector("body[data-ready=true]")
        reopened = page.locator("#transcript li.approval")
        assert reopened.count() == 1 and reopened.get_attribute("data-state") == "waiting"
        assert json.loads(reopened.locator("pre.args").text_content()) == {"order": "C3", "amount": 5}
        assert page.locator("#approvals li.approval-entry").count() == 3
        assert problems == []
    finally:
        api.stop()


def page_session(page: Any) -> str:
    session: str = page.evaluate("() => new URLSearchParams(window.location.search).get('session')")
    return session


def recorded_approvals() -> dict[str, Any]:
    """A running session with an expired call, a reviewer's denial and a group's batch waiting for the user."""
    def approval(approval_id: str, calls: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {"id": approval_id, "step": "DeskStep", "namespace": "desk", "calls": calls, "digest": "d" * 64,
                "approver": "user", "createdAt": "2026-03-22T10:00:00.000Z", "expiresAt": "2026-03-22T10:10:00.000Z",
                **fields}

    return SessionDoc.model_validate({
        "id": "recorded",
        "revision": 4,
        "runStatus": "running",
        "flow": {"name": "DeskFlow", "model": {"provider": "openai", "name": "gpt-4o"},
                 "steps": [{"name": "DeskStep", "state": {}}], "currentStep": "DeskStep",
                 "sequence": [{"level": 1, "stepName": "DeskStep"}]},
        "approvals": [
            approval("ap_late", [{"name": "refund", "args": {"order": "<b>A1</b>", "amount": 250}}],
                     status="expired", decidedAt="2026-03-22T10:10:01.000Z", reason="expired", settled=True),
            approval("ap_credit", [{"name": "goodwill", "args": {"order": "C3", "amount": 40}}], approver="reviewer",
                     status="denied", decidedAt="2026-03-22T11:00:00.000Z", decidedBy="bob",
                     reason="<script>window.pwned = 1</script>", settled=True),
            approval("ap_batch", [{"name": "refund", "args": {"order": "D4", "amount": 5}},
                                  {"name": "goodwill", "args": {"order": "D4", "amount": 1}}], group=True),
        ],
    }).to_json_dict()


def test_the_inspector_shows_every_kind_of_record_and_the_page_offers_the_waiting_batch(
    page, start_server, problems
):
    doc = recorded_approvals()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(["DeskFlow"])}

    catalog = {"DeskFlow": {"refund": REFUND_DESCRIPTION, "goodwill": "Pay goodwill credit on an order."}}
    inspector = Inspector(lambda session_id: doc if session_id == "recorded" else None, lambda: catalog)
    url = start_server(handler=handler, inspector=inspector)
    page.goto(f"{url}/?session=recorded", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_selector("body[data-ready=true]")

    entries = page.locator("#approvals li.approval-entry")
    assert entries.evaluate_all("items => items.map(i => i.dataset.status)") == ["expired", "denied", "pending"]
    late = page.locator('#approvals li[data-approval-id="ap_late"]')
    assert late.locator('[data-fact="decidedBy"]').text_content() == "nobody (expired)"
    assert json.loads(late.locator("pre.args").text_content()) == {"order": "<b>A1</b>", "amount": 250}
    credit = page.locator('#approvals li[data-approval-id="ap_credit"]')
    assert credit.locator('[data-fact="decidedBy"]').text_content() == "bob"
    assert credit.locator('[data-fact="approver"]').text_content() == "a reviewer"
    assert credit.locator('[data-fact="reason"]').text_content() == "<script>window.pwned = 1</script>"
    page.wait_for_function("() => !document.querySelector('#approvals [data-approval-id=ap_credit] "
                           ".tool-description').hidden")
    assert credit.locator(".tool-description").text_content() == "Pay goodwill credit on an order."

    # The waiting batch is offered as one call, each of its tools described.
    [card] = page.locator("#transcript li.approval").all()
    assert card.get_attribute("data-approval-id") == "ap_batch" and card.get_attribute("data-state") == "pending"
    assert card.locator(".tool-name").text_content() == "refund+goodwill"
    assert json.loads(card.locator("pre.args").text_content()) == [
        {"tool": "refund", "arguments": {"order": "D4", "amount": 5}},
        {"tool": "goodwill", "arguments": {"order": "D4", "amount": 1}}]
    page.wait_for_function("() => !document.querySelector('#transcript li.approval .tool-description').hidden")
    assert card.locator(".tool-description").text_content() == f"{REFUND_DESCRIPTION} Pay goodwill credit on an order."
    assert page.evaluate("() => window.pwned") is None
    assert page.locator("#approvals script").count() == 0
    assert problems == []

