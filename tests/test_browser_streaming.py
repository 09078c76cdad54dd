"""The chat page of ``picoflow serve`` shows a reply as the model writes it, in a real (headless) Chromium.

The page asks for its turns as server-sent events: the first words must be on screen while the scripted model
is still writing, text taken back (``reset``) must stay visibly discarded, and an aborted turn's words must be
marked as discarded. Screenshots go to ``ignore/screenshots/``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import SCREENSHOTS, ApiServer, launched_chromium

PAGE_TIMEOUT_MS = 30_000
WORDS = "one two three four five six seven eight nine ten"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[[list[dict[str, Any]]], ApiServer]]:
    servers: list[ApiServer] = []

    def start(replies: list[dict[str, Any]]) -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", replies, None)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 700})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
        except Exception as exc:  # a diagnostic only: never hide the test's own outcome
            warnings.warn(f"no screenshot of {request.node.name}: {exc}", stacklevel=1)
        finally:
            context.close()


def send(page: Any, api: ApiServer, text: str) -> None:
    page.goto(api.url + "/", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function("() => document.getElementById('flow').value === 'TinyFlow'")
    page.fill("#message", text)
    page.press("#message", "Enter")


def test_the_first_words_are_on_screen_before_the_model_has_finished(page, start_api):
    api = start_api([{"content": WORDS, "delay": 0.3, "chunk_delay": 0.4}])
    send(page, api, "Count to ten")
    page.wait_for_function(
        "() => (document.querySelector('.turn.bot.streaming .text') || {}).textContent?.includes('one')"
    )
    early = page.evaluate("() => document.querySelector('.turn.bot.streaming .text').textContent")
    assert "ten" not in early, f"the whole reply was already there: {early!r}"

    page.wait_for_function("() => document.body.dataset.turns === '1'")
    bubbles = page.locator(".turn.bot")
    assert bubbles.count() == 1
    assert bubbles.first.inner_text().endswith(WORDS)
    assert "streaming" not in (bubbles.first.get_attribute("class") or "")
    assert list(api.stored_sessions()), "the streamed turn was committed"


def test_taken_back_text_stays_marked_and_the_reply_follows(page, start_api):
    api = start_api([
        {"content": "The red room", "error": "connection reset", "status": 503, "break_after": 2, "chunk_delay": 0.05},
        {"content": "The blue room is free.", "chunk_delay": 0.05},
    ])
    send(page, api, "Which room?")
    page.wait_for_function("() => document.body.dataset.turns === '1'")
    discarded = page.locator(".turn.bot.discarded")
    assert discarded.count() == 1
    assert "The red" in discarded.first.inner_text()
    assert "discarded" in discarded.first.locator(".who").text_content()
    kept = page.locator(".turn.bot:not(.discarded)")
    assert kept.count() == 1 and kept.first.inner_text().endswith("The blue room is free.")


def test_an_aborted_turn_shows_its_words_as_not_part_of_any_reply(page, start_api):
    api = start_api([
        {"content": "The red room is", "error": "bad request", "status": 400, "break_after": 3, "chunk_delay": 0.05},
    ])
    send(page, api, "Which room?")
    page.wait_for_function("() => document.body.dataset.turns === '1'")
    # The failed call took its words back (a reset) before the turn aborted.
    assert page.locator(".turn.bot").count() == page.locator(".turn.bot.discarded").count() == 1
    assert "The red room" in page.locator(".turn.bot.discarded").first.inner_text()
    error = page.locator(".note.error").first.inner_text()
    assert "Aborted MODEL_UNAVAILABLE" in error
    assert "bad request" not in page.content()
    assert "The red room" not in json.dumps(api.stored_sessions())


def test_each_turn_has_its_own_idempotency_key_and_a_retry_reuses_it(page, start_api):
    api = start_api([
        # Not retried by the engine (a 400), so the turn aborts with a retryable code the page offers to retry.
        {"content": "The red room", "error": "bad request", "status": 400, "break_after": 1},
        {"content": "The blue room is free."},
        {"content": "You are welcome."},
    ])
    keys: list[str | None] = []
    page.on("request", lambda request: keys.append(request.headers.get("idempotency-key"))
            if request.url.endswith("/ai/run") else None)
    send(page, api, "Which room?")
    page.wait_for_function("() => document.body.dataset.turns === '1'")
    assert "Aborted MODEL_UNAVAILABLE" in page.locator(".note.error").first.inner_text()
    page.click("button.retry")
    page.wait_for_function("() => document.body.dataset.turns === '2'")
    assert page.locator(".turn.bot:not(.discarded)").first.inner_text().endswith("The blue room is free.")
    assert page.locator("button.retry").count() == 0
    page.fill("#message", "Thanks")
    page.press("#message", "Enter")
    page.wait_for_function("() => document.body.dataset.turns === '3'")
    assert len(keys) == 3 and all(keys)
    assert keys[0] == keys[1] != keys[2]
