"""A web page on one origin talks to the HTTP API on another, in a real (headless) Chromium.

The page (``tests/support/cors_page.html``) is served on one loopback port and calls ``picoflow serve`` on
another, so every call is cross-origin: it lists the flows, runs three turns of ``TinyFlow`` carrying the
``CHAT_SESSION_ID`` it reads from each response's headers, and ends the session. That only works when the
API answers the preflights and exposes the session header (``CORS_ALLOW_ORIGIN``); without it, or for
another origin, the browser must refuse the calls. Screenshots go to ``ignore/screenshots/``.
"""

from __future__ import annotations

import http.client
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from tests.support.browser import (
    SCREENSHOTS,
    ApiServer,
    PageServer,
    launched_chromium,
)

MESSAGES = ["Hello from the browser", "A second turn", "And a third one"]
REPLIES = ["reply 1", "reply 2", "reply 3"]
PAGE_TIMEOUT_MS = 30_000
# The page gives each fetch 15 s; the whole conversation gets this long.
RESULTS_TIMEOUT_MS = 60_000
OTHER_ORIGIN = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def page_server() -> Iterator[PageServer]:
    server = PageServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[..., ApiServer]]:
    servers: list[ApiServer] = []

    def start(cors_allow_origin: str | None, replies: list[str] = REPLIES) -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", replies, cors_allow_origin)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def console_log() -> list[str]:
    """What the page printed to its console, as ``type: text`` lines."""
    return []


@pytest.fixture
def page(browser: Any, console_log: list[str], request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 600})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: console_log.append(f"{message.type}: {message.text}"))
    try:
        yield page
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = request.node.name.replace("[", "-").replace("]", "").replace("/", "_")
        try:
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True, timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:  # a diagnostic only: never hide the test's own outcome
            warnings.warn(f"no screenshot of {name}: {exc}", stacklevel=1)
        finally:
            context.close()


def page_url(page_server: PageServer, api: ApiServer | None, **extra: str) -> str:
    query = {"api": api.url, "messages": ",".join(MESSAGES)} if api else {}
    query.update(extra)
    return f"{page_server.origin}/?{urlencode(query)}"


def wait_for(page: Any, flag: str) -> dict[str, Any]:
    page.wait_for_function(f"() => window.results && window.results.{flag} === true", timeout=RESULTS_TIMEOUT_MS)
    return page.evaluate("() => window.results")


def memory_messages(doc: dict[str, Any], kind: str) -> list[str]:
    return [message["content"] for message in doc["flow"]["memory"]["chat"]["messages"] if message["type"] == kind]


def test_a_page_on_another_origin_runs_a_whole_conversation(page, page_server, start_api):
    api = start_api(page_server.origin)
    assert urlsplit(api.url).port != urlsplit(page_server.origin).port, "the page and the API must be two origins"

    page.goto(page_url(page_server, api, hold="1"), timeout=PAGE_TIMEOUT_MS)
    results = wait_for(page, "turnsDone")
    assert results["origin"] == page_server.origin

    flows = results["flows"]
    assert flows["ok"], f"GET /ai/flows failed: {flows}\n{api.output()}"
    assert flows["status"] == 200
    assert "TinyFlow" in flows["json"]

    turns = results["turns"]
    assert [turn.get("error") for turn in turns] == [None] * 3, f"{turns}\n{api.output()}"
    assert all(turn["ok"] and turn["status"] == 200 and turn["json"]["success"] for turn in turns)
    session = turns[0]["sessionHeader"]
    assert session, "the CHAT_SESSION_ID response header was not readable by the page"
    assert [turn["sessionHeader"] for turn in turns] == [session] * 3
    assert [turn["json"]["session"] for turn in turns] == [session] * 3
    # The first turn started the session; the next two sent back the id read from the response header.
    assert [turn["sentSession"] for turn in turns] == [None, session, session]
    assert [turn["reply"] for turn in turns] == REPLIES

    stored = api.stored_sessions()
    assert list(stored) == [session], "the server must hold exactly the page's one session"
    doc = stored[session]
    assert doc["flow"]["name"] == "TinyFlow"
    assert memory_messages(doc, "ai") == REPLIES
    humans = memory_messages(doc, "human")
    assert [message for message in humans if message in MESSAGES] == MESSAGES

    page.evaluate("() => window.finish()")
    results = wait_for(page, "done")
    end = results["end"]
    assert end["ok"], f"POST /ai/end failed: {end}\n{api.output()}"
    assert end["status"] == 200
    assert end["sentSession"] == session
    assert end["json"] == {"success": True, "session": session}
    assert api.stored_sessions() == {}
    assert results["status"] == "all calls succeeded"


def test_the_page_can_read_the_session_header_but_not_unexposed_ones(page, page_server, start_api):
    api = start_api(page_server.origin, replies=["only reply"])
    page.goto(page_url(page_server, None), timeout=PAGE_TIMEOUT_MS)  # no api= parameter: the page stays idle
    seen = page.evaluate(
        """async (api) => {
            const response = await fetch(api + "/ai/run", {
                method: "POST",
                headers: {"Content-Type": "application/json"},
                body: JSON.stringify({flowName: "TinyFlow", message: "Hi"}),
                signal: AbortSignal.timeout(15000),
            });
            const body = await response.json();
            return {
                status: response.status,
                session: response.headers.get("CHAT_SESSION_ID"),
                sessionLower: response.headers.get("chat_session_id"),
                server: response.headers.get("Server"),
                date: response.headers.get("Date"),
                body: body,
            };
        }""",
        api.url,
    )
    assert seen["status"] == 200, f"{seen}\n{api.output()}"
    assert seen["session"] is not None, "CHAT_SESSION_ID must be listed in Access-Control-Expose-Headers"
    assert seen["session"] == seen["sessionLower"] == seen["body"]["session"]
    assert list(api.stored_sessions()) == [seen["session"]]

    # The server does send Server and Date, but the browser hides headers the API does not expose:
    # the session header above is readable only because it is exposed.
    host, port = urlsplit(api.url).hostname, urlsplit(api.url).port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/health", headers={"Origin": page_server.origin})
        response = conn.getresponse()
        response.read()
        assert response.getheader("Server") and response.getheader("Date")
    finally:
        conn.close()
    assert seen["server"] is None
    assert seen["date"] is None


@pytest.mark.parametrize("cors_allow_origin", [None, OTHER_ORIGIN], ids=["cors-off", "other-origin"])
def test_the_browser_blocks_the_page_when_its_origin_is_not_allowed(
    page, page_server, start_api, console_log, cors_allow_origin
):
    api = start_api(cors_allow_origin)
    page.goto(page_url(page_server, api), timeout=PAGE_TIMEOUT_MS)
    results = wait_for(page, "done")

    flows = results["flows"]
    assert not flows["ok"]
    assert flows["error"].startswith("TypeError"), flows  # fetch rejects: the response is withheld from the page
    assert "status" not in flows

    (turn,) = results["turns"]
    assert not turn["ok"]
    assert turn["error"].startswith("TypeError"), turn
    assert results["end"] is None
    assert results["status"] == "failed"

    # The server answered the simple GET (the browser hid the answer) and the preflight, but the
    # browser never sent the turn itself: no session exists.
    log = api.output()
    assert '"GET /ai/flows HTTP/1.1" 200' in log
    assert '"OPTIONS /ai/run HTTP/1.1"' in log
    assert '"POST /ai/run' not in log
    assert api.stored_sessions() == {}
    assert any("CORS policy" in message for message in console_log), console_log
