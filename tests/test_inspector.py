"""The chat page and session inspector of ``picoflow serve`` (``picoflow/local/inspector.py``, ``static/``).

* the local routes without a browser: ``GET /ai/session`` (header checks, 404 for unknown or owned sessions,
  store failures), the page and its files, and their absence from the Lambda handler itself;
* ``make run``'s pointer to the page, with and without a terminal;
* the page in headless Chromium: a whole HotelFlow conversation typed into it (tables rendered as tables, the
  inspector following the stored document turn by turn), hostile model text kept as text, JSON replies,
  "New chat", and a session opened from the address. Screenshots go to ``ignore/screenshots/``.
"""

from __future__ import annotations

import fnmatch
import http.client
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
import warnings
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

import handlers.api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.errors import SessionFlowInvariantError, SessionStoreError
from picoflow.local.chat import ChatClient
from picoflow.local.cli import main as cli_main
from picoflow.local.inspector import Inspector
from picoflow.local.serve import LambdaHTTPServer, make_server
from picoflow.session.document import FlowDoc, SessionDoc
from tests.support.browser import SCREENSHOTS, ApiServer, launched_chromium
from tests.support.files import contains_file, invoice_replies

ROOT = Path(__file__).resolve().parents[1]
HOTEL = json.loads((ROOT / "flows" / "hotel" / "conversation.json").read_text(encoding="utf-8"))
INVOICE_IMAGE = ROOT / "flows" / "invoice" / "sample_invoice.png"
TOKEN_FIELDS = [
    "inputTokens", "outputTokens", "totalTokens", "reasoningTokens", "visibleOutputTokens", "cachedInputTokens",
    "cacheCreationInputTokens",
]
PAGE_TIMEOUT_MS = 30_000
DEMO_TIMEOUT_SECONDS = 180


def request(url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


# -- the local routes, without a browser --------------------------------------------------------------


@pytest.fixture
def real_handler(tmp_path, monkeypatch) -> Iterator[None]:
    """``handlers.api`` with a fresh engine: TinyFlow, a scripted model and the in-memory store."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": f"reply {n}"} for n in range(1, 6)]), encoding="utf-8")
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("PICOFLOW_FLOWS", "tests.support.tiny_flow")
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
        server = make_server("127.0.0.1", 0, **options)
        server.access_log = False
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_turn(url: str, message: str, session: str | None = None) -> str:
    headers = {"Content-Type": "application/json", **({"CHAT_SESSION_ID": session} if session else {})}
    body = json.dumps({"flowName": "TinyFlow", "message": message}).encode()
    status, response_headers, payload = request(url, "POST", "/ai/run", headers, body)
    assert status == 200, payload
    return response_headers["CHAT_SESSION_ID"]


def stored(session: str) -> dict[str, Any]:
    runtime = aws_runtime.get_runtime()
    return runtime.call(runtime.engine.session_store.load(session), timeout=10).to_json_dict()


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_session_route_returns_the_one_stored_document(real_handler, start_server):
    url = start_server(inspector=True)
    session = run_turn(url, "Hi")
    other = run_turn(url, "Someone else")
    run_turn(url, "Again", session)

    status, headers, body = request(url, "GET", "/ai/session", {"CHAT_SESSION_ID": session})
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    assert "Access-Control-Allow-Origin" not in headers  # only the page itself (same origin) may read it
    doc = json.loads(body)
    assert doc == stored(session)
    assert doc["id"] == session and doc["revision"] == 2
    assert other not in body.decode()
    # The spelling some proxies use, and HEAD, are answered too.
    assert request(url, "GET", "/ai/session", {"chat-session-id": other})[0] == 200
    status, headers, body = request(url, "HEAD", "/ai/session", {"CHAT_SESSION_ID": session})
    assert (status, body) == (200, b"") and int(headers["Content-Length"]) > 0


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 400, "BAD_REQUEST"),
        ({"CHAT_SESSION_ID": "   "}, 400, "BAD_REQUEST"),
        ({"CHAT_SESSION_ID": "not an id!"}, 400, "BAD_REQUEST"),
        ({"CHAT_SESSION_ID": "x" * 129}, 400, "BAD_REQUEST"),
        ({"CHAT_SESSION_ID": "0123456789abcdef0123456789abcdef"}, 404, "SESSION_NOT_FOUND"),
    ],
    ids=["no-header", "blank", "bad-characters", "too-long", "unknown"],
)
@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_session_route_refuses_bad_or_unknown_ids(real_handler, start_server, headers, status, code):
    url = start_server(inspector=True)
    answer_status, answer_headers, body = request(url, "GET", "/ai/session", headers)
    assert answer_status == status
    assert answer_headers["Content-Type"] == "application/json"
    answer = json.loads(body)
    assert answer["success"] is False and answer["code"] == code and answer["message"]


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_a_session_owned_by_a_principal_is_not_shown(real_handler, start_server):
    url = start_server(inspector=True)
    runtime = aws_runtime.get_runtime()
    store = runtime.engine.session_store
    runtime.call(store.create(FlowDoc(name="TinyFlow"), session_id="owned-session", owner="alice"), timeout=10)
    status, _, body = request(url, "GET", "/ai/session", {"CHAT_SESSION_ID": "owned-session"})
    assert (status, json.loads(body)["code"]) == (404, "SESSION_NOT_FOUND")


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (SessionStoreError("load", "abc", "disk on fire: /var/secret"), 500, "SESSION_STORE_ERROR"),
        (SessionFlowInvariantError("Session 'x' is not a valid one-flow document: secret detail"), 409,
         "SESSION_FLOW_INVARIANT"),
        (TimeoutError(), 503, "SESSION_STORE_ERROR"),
    ],
    ids=["store-error", "unreadable-document", "timeout"],
)
def test_a_failed_read_is_a_json_error_without_its_details(error, status, code):
    def read(session_id: str) -> dict[str, Any]:
        raise error

    answer_status, headers, body = Inspector(read).answer("GET", "/ai/session", {"CHAT_SESSION_ID": "abc"})
    answer = json.loads(body)
    assert (answer_status, answer["code"]) == (status, code)
    assert "secret" not in answer["message"]


def test_the_page_and_its_files_are_served_with_a_strict_policy(start_server):
    url = start_server(handler=lambda event, context: {"statusCode": 404, "body": "handler"}, inspector=True)
    status, headers, body = request(url, "GET", "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    page = body.decode()
    assert '<script src="/_inspector/app.js"' in page and 'href="/_inspector/app.css"' in page
    for name, kind in [("app.js", "text/javascript"), ("app.css", "text/css"), ("index.html", "text/html")]:
        status, headers, _ = request(url, "GET", f"/_inspector/{name}")
        assert (status, headers["Content-Type"].split(";")[0]) == (200, kind)
    # Anything else is the handler's to answer: other files, other methods, the page under another name.
    for method, path in [("GET", "/_inspector/inspector.py"), ("GET", "/_inspector/../inspector.py"),
                         ("GET", "/index.html"), ("POST", "/"), ("DELETE", "/ai/session")]:
        assert request(url, method, path)[2] == b"handler", (method, path)


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_without_the_inspector_the_server_is_the_handler_alone(real_handler, start_server):
    url = start_server()
    session = run_turn(url, "Hi")
    for path in ("/", "/ai/session", "/_inspector/app.js"):
        status, _, body = request(url, "GET", path, {"CHAT_SESSION_ID": session})
        assert (status, json.loads(body)["code"]) == (404, "NOT_FOUND"), path


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_the_lambda_handler_has_neither_the_session_route_nor_the_page(real_handler):
    context = FakeLambdaContext()
    started = handlers.api.lambda_handler(http_event("POST", "/ai/run", body={"flowName": "TinyFlow", "message": "Hi"}),
                                          context)
    assert started["statusCode"] == 200
    session = json.loads(started["body"])["session"]

    for path in ("/ai/session", "/", "/_inspector/app.js"):
        event = http_event("GET", path, headers={"CHAT_SESSION_ID": session})
        result = handlers.api.lambda_handler(event, FakeLambdaContext())
        assert result["statusCode"] == 404, path
        assert json.loads(result["body"])["code"] == "NOT_FOUND"
        assert "flow" not in json.loads(result["body"])


def test_the_page_ships_inside_the_package_small_and_self_contained():
    static = resources.files("picoflow.local").joinpath("static")
    files = {name: static.joinpath(name).read_text(encoding="utf-8") for name in ("index.html", "app.js", "app.css")}
    assert sum(len(text.encode()) for text in files.values()) < 120_000
    # Nothing is fetched from elsewhere: no CDN, no remote font, no module import.
    for name, text in files.items():
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text), name
        assert "@import" not in text and "url(http" not in text and "import(" not in text, name
    # The page never parses strings as HTML: model and user text only ever become text nodes.
    code = "\n".join(line for line in files["app.js"].splitlines() if not line.strip().startswith(("//", "/*", "*")))
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", code)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    patterns = package_data["package-data"]["picoflow.local"]
    assert all(any(fnmatch.fnmatch(f"static/{name}", pattern) for pattern in patterns) for name in files)


@pytest.mark.parametrize("flag", [[], ["--no-inspector"]], ids=["default", "no-inspector"])
def test_picoflow_serve_announces_the_page_unless_turned_off(monkeypatch, capsys, flag):
    for name in ("SESSION_STORE", "PICOFLOW_FLOWS"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    servers = []

    def interrupted(self, poll_interval=0.5):
        servers.append(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(LambdaHTTPServer, "serve_forever", interrupted)
    assert cli_main(["serve", "--port", "0", *flag]) == 0
    out = capsys.readouterr().out
    url = servers[0].url
    if flag:
        assert servers[0].inspector is None
        assert "inspector" not in out and "/ai/session" not in out
    else:
        assert isinstance(servers[0].inspector, Inspector)
        assert f"Chat page and session inspector: {url}/\n" in out
        assert "local only: GET /ai/session" in out


# -- make run -----------------------------------------------------------------------------------------


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    return env


def wait_for_listening(process: subprocess.Popen, output: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", output.read_text(errors="replace"))
        if match:
            return match.group(1)
        assert process.poll() is None, output.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError(f"not listening:\n{output.read_text(errors='replace')}")


def test_make_run_prints_how_to_open_the_finished_session(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "picoflow.local.demo", "--flow", "BasicFlow"],
        capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS, cwd=ROOT, env=demo_env(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    match = re.search(r"serve the same sessions file:\n  (.+ serve --port 8000)\nand open "
                      r"http://127\.0\.0\.1:8000/\?session=(\w+)\n", result.stdout)
    assert match, result.stdout[-1500:]
    command, session = match.groups()

    # The printed command, on a free port, serves the page and the finished session.
    words = shlex.split(command)
    assignments = next(index for index, word in enumerate(words) if "=" not in word)
    env = {**demo_env(tmp_path), **dict(word.split("=", 1) for word in words[:assignments])}
    program = words[assignments:-1] + ["0"]
    output = tmp_path / "serve.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(program, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        url = wait_for_listening(process, output)
        status, _, body = request(url, "GET", "/ai/session", {"CHAT_SESSION_ID": session})
        assert status == 200, body
        doc = json.loads(body)
        assert (doc["id"], doc["flow"]["name"], doc["runStatus"]) == (session, "BasicFlow", "completed")
        assert request(url, "GET", f"/?session={session}")[0] == 200
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_demo_with_serve_keeps_the_page_up_until_ctrl_c(tmp_path):
    controller, terminal = pty.openpty()
    env = {key: value for key, value in demo_env(tmp_path).items() if key != "CI"}
    process = subprocess.Popen(
        [sys.executable, "-m", "picoflow.local.demo", "--flow", "BasicFlow", "--serve"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
    )
    os.close(terminal)
    seen = b""

    def read_until(pattern: bytes, timeout: float) -> re.Match[bytes]:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, seen)):
            remaining = deadline - time.monotonic()
            assert remaining > 0, seen.decode(errors="replace")[-2000:]
            ready, _, _ = select.select([controller], [], [], min(remaining, 0.5))
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the terminal closed: the demo exited
                    chunk = b""
                assert chunk or process.poll() is None, seen.decode(errors="replace")[-2000:]
                seen += chunk
        return match

    try:
        opened = rb"Open (http://127\.0\.0\.1:\d+)/\?session=(\w+) to inspect the session\. Ctrl\+C to stop\."
        match = read_until(opened, DEMO_TIMEOUT_SECONDS)
        url, session = match.group(1).decode(), match.group(2).decode()
        time.sleep(0.3)
        assert process.poll() is None, "the demo must keep serving in a terminal"
        status, _, body = request(url, "GET", "/ai/session", {"CHAT_SESSION_ID": session})
        assert status == 200 and json.loads(body)["runStatus"] == "completed"
        assert request(url, "GET", "/")[0] == 200
        process.send_signal(signal.SIGINT)
        read_until(rb"Stopped\.", 30)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(controller)


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
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: problems.append(f"console: {message.text}") if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
    try:
        yield page
    finally:
        screenshot(page, request.node.name)
        context.close()


def screenshot(page: Any, name: str, *, tall: bool = False) -> None:
    """A screenshot for a person to look at; ``tall`` shows the whole inspector (its pane scrolls otherwise)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    name = "inspector-" + name.replace("[", "-").replace("]", "").replace("/", "_")
    try:
        if tall:
            height = page.evaluate("() => document.getElementById('inspector').scrollHeight + 60")
            page.set_viewport_size({"width": 1400, "height": max(900, min(height, 8000))})
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), timeout=PAGE_TIMEOUT_MS)
    except Exception as exc:  # a diagnostic only: never hide the test's own outcome
        warnings.warn(f"no screenshot {name}: {exc}", stacklevel=1)
    finally:
        if tall:
            page.set_viewport_size({"width": 1400, "height": 900})


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[..., ApiServer]]:
    servers: list[ApiServer] = []

    def start(replies: list[Any], flows: str) -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", replies, None, flows=flows)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def open_page(page: Any, api: ApiServer, query: str = "") -> None:
    page.goto(f"{api.url}/{query}", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_selector("body[data-ready=true]")


def say(page: Any, text: str, turn: int) -> None:
    """Type one message, send it with Enter, and wait until the reply and the inspector's refresh are in."""
    page.locator("#message").press_sequentially(text)
    page.press("#message", "Enter")
    page.wait_for_selector(f'body[data-turns="{turn}"][data-busy="false"]')


def last_bot(page: Any) -> Any:
    return page.locator("#transcript li.turn.bot").last


def page_session(page: Any) -> str | None:
    """The session the page keeps in its address (so that a reload reopens it)."""
    return parse_qs(urlsplit(page.url).query).get("session", [None])[0]


def number(text: str) -> int:
    return int(text.replace(",", "").strip())


def test_a_whole_hotel_conversation_in_the_page(page, start_api, problems):
    replies = [reply for turn in HOTEL["turns"] for reply in turn.get("replies", [])]
    api = start_api(replies, "flows.hotel")
    open_page(page, api)
    assert page.locator("#inspector-empty").is_visible()
    page.select_option("#flow", "HotelFlow")
    page.fill("#config", json.dumps(HOTEL["config"]))

    session = None
    for number_of_turn, turn in enumerate(HOTEL["turns"], start=1):
        say(page, turn["user"], number_of_turn)
        assert page.locator("#transcript li.note.error").count() == 0, api.output()
        session = session or page_session(page)
        doc = api.stored_sessions()[session]
        # The inspector was refreshed after the turn: it shows the stored revision and current step.
        assert page.locator("#session-head .revision").text_content() == str(doc["revision"])
        assert page.locator("#session-head .current-step").text_content() == doc["flow"]["currentStep"]
        assert page.locator("#diagram .node.current").get_attribute("data-step") == doc["flow"]["currentStep"]
        assert page.locator("#path li").count() == len(doc["flow"]["sequence"])

        if turn["user"].startswith("compare 2,5,7 on price"):
            # The comparison arrives as a markdown table and is rendered as an HTML table.
            table = last_bot(page).locator("table")
            assert table.count() == 1
            header = table.locator("thead th").all_text_contents()
            assert header == ["Feature", "Hampton Inn Portland-Airport", "Hampton Inn Portland/Clackamas",
                              "Hampton Inn Portland East"]
            rows = table.locator("tbody tr")
            assert rows.count() == 6
            assert rows.last.locator("td").all_text_contents() == ["Total", "$2,118.21", "$1,831.54", "$1,895.24"]
            assert "|" not in last_bot(page).inner_text()
            assert "Another comparison, or ready to book?" in last_bot(page).locator("p").last.inner_text()
            assert doc["flow"]["currentStep"] == "CompareStep"
            screenshot(page, "hotel-comparison")

    doc = api.stored_sessions()[session]
    assert doc["runStatus"] == "completed"
    flow = doc["flow"]
    assert page.locator("#session-head .run-completed").text_content() == "completed"
    assert page.locator("#transcript li.note").last.text_content().startswith("Session completed")
    assert page.locator("#diagram .node.current").get_attribute("data-step") == "TerminateSessionStep"
    assert page.locator("#diagram .node").evaluate_all("nodes => nodes.map(n => n.dataset.step)") == [
        step["name"] for step in flow["steps"]
    ]
    assert page.locator("#path li .step").all_text_contents() == [item["stepName"] for item in flow["sequence"]]
    assert page.locator("#path li .badge.current").count() == 1

    # Each step's stored state.
    for step in flow["steps"]:
        block = page.locator(f'#states details[data-key="state:{step["name"]}"] pre.json')
        assert json.loads(block.text_content()) == step["state"]

    # The hotel-explore namespace: its rolling summary after compaction, and its tool calls paired with results.
    explore = flow["memory"]["hotel-explore"]
    assert explore["summary"], "the conversation compacts hotel-explore"
    part = page.locator('#memory details[data-ns="hotel-explore"]')
    if not part.evaluate("node => node.open"):
        part.locator("summary").first.click()
    assert part.locator(".summary .content").inner_text() == explore["summary"]
    assert part.locator(".summary-badge").count() == 1
    assert part.locator("li.msg").count() == len(explore["messages"])
    assert part.locator("li.msg").first.locator(".badge").first.text_content() == "system slot"
    calls = [call for message in explore["messages"] for call in message.get("tool_calls", [])]
    assert part.locator(".call").count() == len(calls)
    first_call = part.locator(".call").first
    assert first_call.locator("strong").text_content() == calls[0]["name"]
    assert json.loads(first_call.locator("pre.args").text_content()) == calls[0]["args"]
    assert first_call.locator(".result .content").text_content() == "input validated"
    part.scroll_into_view_if_needed()

    # Token totals and their breakdown, as stored.
    for field in TOKEN_FIELDS:
        assert number(page.locator(f'#tokens [data-token="{field}"]').text_content()) == doc["tokens"][field], field
    assert doc["tokens"]["totalTokens"] > 0

    # The log arrays, with their counts.
    for kind in ("log", "warn", "error"):
        counter = page.locator(f'#logs details[data-key="log:{kind}"] summary .hint')
        assert counter.text_content() == str(len(doc[kind]))

    assert problems == []
    screenshot(page, "hotel-final", tall=True)


HOSTILE = "\n".join([
    "# Title",
    "",
    '<img src=x onerror="window.pwned = 1"> **bold** and *em* and `code <b>` and snake_case_name',
    "",
    "[click](javascript:window.pwned=2) and [docs](https://example.com/docs)",
    "",
    "| Column | <b>Other</b> |",
    "| :----- | -----: |",
    "| <script>window.pwned = 3</script> | 2 |",
    "",
    "1. one",
    "2. two",
    "   - nested",
    "",
    "```",
    "<b>raw</b>",
    "```",
])


def test_model_and_user_text_never_become_markup(page, start_api, problems):
    api = start_api([HOSTILE, '{"b": [1, 2], "a": "<i>x</i>"}'], "tests.support.echo_flows")
    open_page(page, api, "?flow=EchoFlow")
    assert page.input_value("#flow") == "EchoFlow"
    user_text = '<img src=x onerror="window.pwned = 4"> hello'
    say(page, user_text, 1)

    bubble = last_bot(page)
    assert page.evaluate("() => window.pwned") is None
    assert page.locator("#chat-pane img, #chat-pane script, #inspector img, #inspector script").count() == 0
    assert page.locator("#transcript li.turn.user .text").text_content() == user_text
    assert bubble.locator("h1").text_content() == "Title"
    assert bubble.locator("strong").text_content() == "bold"
    assert bubble.locator("em").text_content() == "em"
    assert bubble.locator("p code").text_content() == "code <b>"
    assert "snake_case_name" in bubble.inner_text()
    links = bubble.locator("a")
    assert links.count() == 1 and links.get_attribute("href") == "https://example.com/docs"
    assert "[click](javascript:window.pwned=2)" in bubble.inner_text()
    assert bubble.locator("thead th").all_text_contents() == ["Column", "<b>Other</b>"]
    assert bubble.locator("tbody td").all_text_contents() == ["<script>window.pwned = 3</script>", "2"]
    assert bubble.locator("tbody td").last.get_attribute("class") == "align-right"
    assert bubble.locator("ol > li").count() == 2 and bubble.locator("ol li ul li").text_content() == "nested"
    assert bubble.locator("pre code").text_content() == "<b>raw</b>"
    # The inspector shows the same text, as text.
    memory = page.locator("#memory").inner_text()
    assert user_text in memory and "<script>window.pwned = 3</script>" in memory

    # "New chat" ends the session through POST /ai/end.
    session = page_session(page)
    assert list(api.stored_sessions()) == [session]
    page.click("#new-chat")
    page.wait_for_function("() => document.getElementById('transcript').children.length === 0")
    page.wait_for_selector("#status:has-text('Session ended.')")
    assert api.stored_sessions() == {}
    assert page.locator("#inspector-empty").is_visible()
    assert page_session(page) is None

    # A step with another content type answers with its raw message: JSON is pretty-printed.
    page.select_option("#flow", "JsonFlow")
    say(page, "JSON please", 2)
    bubble = last_bot(page)
    assert bubble.get_attribute("data-content-type").startswith("application/json")
    assert bubble.locator("pre.json").text_content() == json.dumps({"b": [1, 2], "a": "<i>x</i>"}, indent=2)
    assert page.locator("#session-head .current-step").text_content() == "JsonStep"
    assert page.evaluate("() => window.pwned") is None
    assert problems == []


def test_the_page_opens_the_session_named_in_the_address(page, start_api, problems):
    api = start_api(["first", "second", "third"], "tests.support.tiny_flow")
    client = ChatClient(api.url, "TinyFlow", {"tenant": "demo"})
    client.send("one")
    client.send("two")
    session = client.session
    assert session

    revision = api.stored_sessions()[session]["revision"]
    open_page(page, api, f"?session={session}")
    assert page.locator("#session-head .revision").text_content() == str(revision)
    assert page.input_value("#flow") == "TinyFlow"
    assert page.is_disabled("#flow") and page.is_disabled("#config")  # a running session continues as it is
    assert page.locator("#transcript li.note").first.text_content().startswith(f"Opened session {session}")
    chat = page.locator('#memory details[data-ns="chat"] li.msg .content').all_text_contents()
    assert chat[-4:] == ["one", "first", "two", "second"]
    context = page.locator('#states details[data-key="state:context"] pre.json').text_content()
    assert json.loads(context)["config"] == {"tenant": "demo"}

    say(page, "three", 1)
    doc = api.stored_sessions()[session]
    assert doc["revision"] == revision + 1
    assert page.locator("#session-head .revision").text_content() == str(revision + 1)
    assert last_bot(page).inner_text().endswith("third")

    open_page(page, api, "?session=0123456789abcdef0123456789abcdef")
    assert "is not stored" in page.locator("#inspector-empty").text_content()
    problems[:] = [problem for problem in problems if "404" not in problem]  # the expected GET /ai/session 404
    assert problems == []


def crafted_document() -> dict[str, Any]:
    """A document with every part the inspector shows, and markup in every text it could hold."""
    doc = SessionDoc.model_validate({
        "id": "crafted",
        "revision": 7,
        "runStatus": "running",
        "flow": {
            "name": "CraftedFlow",
            "model": {"provider": "openai", "name": "gpt-4o"},
            "context": {"config": {"tenant": "<b>t</b>"}},
            "steps": [
                {"name": "Parent", "state": {"note": "<img src=x onerror=\"window.pwned = 1\">"}},
                {"name": "Child", "state": {}},
                {"name": "Grandchild", "state": {"depth": 3}},
                {"name": "Later", "state": {}},
                {"name": "Unvisited", "state": {}},
            ],
            "currentStep": "Later",
            "sequence": [
                {"level": 1, "stepName": "Parent"},
                {"level": 2, "stepName": "Child"},
                {"level": 3, "stepName": "Grandchild"},
                {"level": 2, "stepName": "Child"},
                {"level": 1, "stepName": "Later"},
            ],
            "memory": {
                "main": {
                    "summary": "Earlier: <script>window.pwned = 2</script>",
                    "summarizedThroughId": "m-0",
                    "messages": [
                        {"type": "system", "content": "You are <b>careful</b>.\nSecond line."},
                        {"type": "human", "content": "look it up"},
                        {"type": "ai", "content": "", "tool_calls": [
                            {"name": "lookup", "args": {"q": "<i>x</i>"}, "id": "call-a"},
                            {"name": "lookup", "args": {"q": "y"}, "id": "call-b"},
                        ]},
                        {"type": "tool", "content": "failed: <b>no</b>", "tool_call_id": "call-a", "name": "lookup",
                         "status": "error"},
                        {"type": "tool", "content": "late result", "tool_call_id": "orphan", "name": "other"},
                        {"type": "ai", "content": [{"type": "text", "text": "a part"}]},
                    ],
                },
            },
        },
        "tokens": {"inputTokens": 1200, "outputTokens": 300, "totalTokens": 1500, "reasoningTokens": 100,
                   "visibleOutputTokens": 200, "cachedInputTokens": 800, "cacheCreationInputTokens": 50},
        "decisionUsage": {"calls": 3, "inputTokens": 40, "outputTokens": 2, "totalTokens": 42},
        "log": [{"timestamp": "2026-01-01T00:00:00.000Z", "level": "info", "message": "<img src=x>", "step": "Parent"}],
        "warn": [{"timestamp": "2026-01-01T00:00:01.000Z", "level": "warn", "message": "careful"}],
        "error": [{"timestamp": "2026-01-01T00:00:02.000Z", "level": "error", "message": "broke <script></script>"}],
        "debug": [{"timestamp": "2026-01-01T00:00:03.000Z", "level": "debug", "message": "details"}],
    })
    return doc.to_json_dict()


def test_the_inspector_shows_every_part_of_a_document(page, start_server, problems):
    doc = crafted_document()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(["CraftedFlow"])}

    inspector = Inspector(lambda session_id: doc if session_id == "crafted" else None)
    url = start_server(handler=handler, inspector=inspector)
    page.goto(f"{url}/?session=crafted", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_selector("body[data-ready=true]")

    assert page.evaluate("() => window.pwned") is None
    assert page.locator("#inspector img, #inspector script").count() == 0
    # The diagram: one box per step, nested ones indented, the current one and the unvisited one marked.
    nodes = page.locator("#diagram .node")
    assert nodes.evaluate_all("nodes => nodes.map(n => n.dataset.step)") == [
        "Parent", "Child", "Grandchild", "Later", "Unvisited"]
    assert page.locator("#diagram .node.current").get_attribute("data-step") == "Later"
    assert page.locator("#diagram .node.unvisited").get_attribute("data-step") == "Unvisited"
    xs = [float(page.locator(f'#diagram .node[data-step="{name}"] rect').get_attribute("x"))
          for name in ("Parent", "Child", "Grandchild")]
    assert xs[0] < xs[1] < xs[2]
    assert page.locator("#diagram path.call").count() == 2  # Parent runs Child, Child runs Grandchild
    assert page.locator("#diagram path.move").count() == 1  # Parent -> Later
    assert page.locator("#path li").evaluate_all("items => items.map(i => i.dataset.level)") == [
        "1", "2", "3", "2", "1"]
    assert page.locator("#path li .badge:not(.current)").all_text_contents() == ["L2", "L3", "L2"]

    # Memory: the summary, the system slot, calls paired with results (or their absence), orphans, parts.
    main = page.locator('#memory details[data-ns="main"]')
    assert main.locator(".summary .content").text_content() == "Earlier: <script>window.pwned = 2</script>"
    assert main.locator("li.msg").first.locator("summary").text_content() == "You are <b>careful</b>."
    calls = main.locator(".call")
    assert calls.count() == 2
    assert calls.first.locator(".result.status-error .content").text_content() == "failed: <b>no</b>"
    assert calls.last.locator(".result.missing").count() == 1
    assert "shown under #2" in main.locator("li.msg").nth(3).text_content()
    assert "its call is not in this memory" in main.locator("li.msg").nth(4).text_content()
    assert json.loads(main.locator("li.msg").nth(5).locator("pre.json").text_content()) == [
        {"type": "text", "text": "a part"}]

    # Tokens with the breakdown, and the decisions' usage beside them.
    for field in TOKEN_FIELDS:
        assert number(page.locator(f'#tokens [data-token="{field}"]').text_content()) == doc["tokens"][field]
        assert number(page.locator(f'#tokens [data-decision-token="{field}"]').text_content()) == \
            doc["decisionUsage"][field]
    assert number(page.locator('#tokens [data-decision-token="calls"]').text_content()) == 3

    # Logs: error, warn and log always, debug because it has an entry, verbose not (it has none).
    kinds = page.locator("#logs details").evaluate_all("parts => parts.map(p => p.dataset.key)")
    assert kinds == ["log:error", "log:warn", "log:log", "log:debug"]
    assert page.locator("#logs li.log-error .content").text_content() == "broke <script></script>"
    assert json.loads(page.locator("#logs li.log-log pre.json").text_content()) == {"step": "Parent"}

    # The raw document, printed on demand.
    page.click("#raw summary")
    assert json.loads(page.locator("#raw-body pre.json").text_content()) == doc
    assert problems == []
    screenshot(page, "crafted-document", tall=True)


def test_the_attach_button_uploads_an_invoice_and_the_reply_shows_the_record(page, start_api, problems):
    api = start_api(invoice_replies("sample_invoice.png"), "flows.invoice")
    open_page(page, api)
    page.select_option("#flow", "InvoiceFlow")

    page.set_input_files("#attach-input", str(INVOICE_IMAGE))
    assert page.locator("#attached").text_content() == "📎 sample_invoice.png"
    say(page, "Please extract this invoice.", 1)

    assert page.locator("#transcript li.note.error").count() == 0, api.output()
    reply = last_bot(page)
    assert reply.get_attribute("data-content-type") == "application/json"
    assert "NW-2026-0142" in reply.text_content() and "7564.24" in reply.text_content()
    assert "sample_invoice.png" in page.locator("#transcript li.turn.user").last.text_content()
    assert page.locator("#attached").text_content() == ""
    [doc] = api.stored_sessions().values()
    assert doc["runStatus"] == "completed"
    assert "file_ref" in json.dumps(doc) and not contains_file(json.dumps(doc), INVOICE_IMAGE.read_bytes())
    assert problems == []


def test_the_inspector_marks_journaled_and_replayed_effect_calls(page, start_server, problems):
    doc = SessionDoc.model_validate({
        "id": "effects",
        "revision": 3,
        "runStatus": "running",
        "flow": {
            "name": "SupportFlow",
            "model": {"provider": "openai", "name": "gpt-4o"},
            "steps": [{"name": "ReturnsStep", "state": {}}],
            "currentStep": "ReturnsStep",
            "sequence": [{"level": 1, "stepName": "ReturnsStep"}],
            "memory": {"returns": {"messages": [
                {"type": "system", "content": "Refund."},
                {"type": "ai", "content": "", "tool_calls": [
                    {"name": "refund_item", "args": {"sku": "HP-200"}, "id": "pay-1"},
                    {"name": "lookup", "args": {}, "id": "plain"},
                ]},
                {"type": "tool", "content": "refunded", "tool_call_id": "pay-1", "name": "refund_item"},
                {"type": "tool", "content": "found", "tool_call_id": "plain", "name": "lookup"},
                {"type": "ai", "content": "", "tool_calls": [
                    {"name": "refund_item", "args": {"sku": "KB-7"}, "id": "pay-2"}]},
                {"type": "tool", "content": "refunded", "tool_call_id": "pay-2", "name": "refund_item"},
            ]}},
        },
        "log": [
            {"timestamp": "2026-01-01T00:00:00.000Z", "level": "log", "message": "effect journaled",
             "step": "ReturnsStep", "tools": ["refund_item"], "toolCallIds": ["pay-1"]},
            {"timestamp": "2026-01-01T00:00:01.000Z", "level": "log", "message": "effect replayed",
             "step": "ReturnsStep", "tools": ["refund_item"], "toolCallIds": ["pay-2"]},
        ],
    }).to_json_dict()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(["SupportFlow"])}

    inspector = Inspector(lambda session_id: doc if session_id == "effects" else None)
    url = start_server(handler=handler, inspector=inspector)
    page.goto(f"{url}/?session=effects", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_selector("body[data-ready=true]")
    calls = page.locator('#memory details[data-ns="returns"] .call')
    assert calls.count() == 3
    badges = [calls.nth(index).locator(".call-head .badge.effect").all_text_contents() for index in range(3)]
    assert badges == [["effect · journaled"], [], ["effect · replayed"]]
    assert calls.nth(2).locator(".badge.effect.replayed").count() == 1
    assert problems == []
    screenshot(page, "effect-calls", tall=True)
