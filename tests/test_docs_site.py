"""The documentation site builds strictly (no broken link, reference or include) and renders in Chromium.

``mkdocs build --strict`` runs once for the module into a temporary folder; the built folder is then served on a
loopback port and the home page and a tutorial page are opened in Debian's Chromium (screenshots go to
``ignore/screenshots/``, as the other browser tests' do).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import SCREENSHOTS, launched_chromium

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_SECONDS = 300
PAGE_TIMEOUT_MS = 30_000


# The theme's end-of-life notice, printed by every `mkdocs` command: read here rather than switched off, and
# answered in docs/concepts/layout.md ("The documentation site").
THEME_NOTICE = "Material for MkDocs reaches end of life on May 5, 2027."
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def build_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    env = {name: value for name, value in os.environ.items() if name != "NO_MKDOCS_2_WARNING"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    lines = [line.strip() for line in _ANSI.sub("", result.stdout + result.stderr).splitlines() if line.strip()]
    return folder, lines


@pytest.fixture(scope="module")
def site(build_output: tuple[Path, list[str]]) -> Path:
    return build_output[0]


def test_the_build_says_nothing_but_the_themes_notice(build_output: tuple[Path, list[str]]) -> None:
    _, lines = build_output
    notice = [line for line in lines if line.startswith("│") or "NO_MKDOCS_2_WARNING" in line]
    # The notice is the one the layout page answers; a new date or a new notice fails here until it is read.
    assert any(THEME_NOTICE in line for line in notice), lines
    assert THEME_NOTICE in (ROOT / "docs" / "concepts" / "layout.md").read_text(encoding="utf-8")
    # Everything else is MkDocs' own progress: no warning, no deprecation, no note from a plugin.
    others = [line for line in lines if line not in notice]
    assert [line for line in others if not line.startswith("INFO")] == [], others
    assert len(others) == 3, others


def test_the_layout_page_names_the_pins_pyproject_makes() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    page = " ".join((ROOT / "docs" / "concepts" / "layout.md").read_text(encoding="utf-8").split())
    for requirement in extras["docs"]:
        name, pins = re.match(r"^([\w-]+)(?:\[\w+\])?(.*)$", requirement).groups()  # type: ignore[union-attr]
        assert f"`{pins}`" in page, f"docs/concepts/layout.md does not name {name}'s pins {pins}"


def test_the_site_builds_strictly_with_every_section(site: Path) -> None:
    for page in ("index.html", "get-started/first-flow/index.html", "tutorials/basic/18-testing/index.html",
                 "tutorials/hotel/index.html", "tutorials/support/index.html", "reference/authoring/index.html"):
        assert (site / page).is_file(), page
    reference = (site / "reference/authoring/index.html").read_text(encoding="utf-8")
    # The API reference is generated from the docstrings, not written by hand.
    for docstring in ("Run a registered child step inside this turn", "A deterministic step"):
        assert docstring in reference
    # The docstrings' sections are rendered: parameter tables, what comes back, examples.
    for rendered in ("Parameters:", "Returns:", "Raises:", "Example", "ask for the family name as well."):
        assert rendered.lower() in reference.lower(), rendered
    # Pages show the code of the tutorial modules they include, not the include line.
    tutorial = (site / "tutorials/basic/04-tools/index.html").read_text(encoding="utf-8")
    assert "save_name" in tutorial and "--8&lt;--" not in tutorial and "--8<--" not in tutorial


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("path", "heading", "shot"),
    [
        ("/", "PicoFlow for Python", "docs-home.png"),
        ("/tutorials/basic/05-go-and-stay/", "5. Routing with go and stay", "docs-tutorial.png"),
    ],
)
def test_a_page_renders_in_chromium(served: str, path: str, heading: str, shot: str) -> None:
    with launched_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1200, "height": 800})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        page = context.new_page()
        failed: list[str] = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.goto(served + path, wait_until="load")
        assert page.locator("article h1").first.inner_text().strip().rstrip("¶").strip() == heading
        # The theme's stylesheet applied (the header bar is laid out), and the navigation lists the sections.
        assert page.locator("header.md-header").first.bounding_box()["height"] > 20
        assert page.get_by_role("navigation").first.is_visible()
        assert page.locator("pre code").count() >= 1
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / shot), full_page=False)
        context.close()
    assert not [url for url in failed if url.startswith(served)], failed


@pytest.mark.parametrize(
    ("path", "shot"),
    [("/reference/authoring/", "docs-reference-1280.png"), ("/tutorials/basic/", "docs-tutorial-1280.png")],
)
def test_pages_at_1280_px_keep_code_in_the_column_and_link_previous_and_next(served: str, path: str, shot: str) -> None:
    with launched_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        page = context.new_page()
        page.goto(served + path, wait_until="load")
        # Every code block fits its column: nothing is cut off or hidden behind a scroll bar.
        overflowing = page.evaluate(
            "() => [...document.querySelectorAll('.md-typeset pre > code')]"
            ".filter(code => code.scrollWidth > code.clientWidth + 1).length"
        )
        assert page.locator(".md-typeset pre > code").count() >= 1
        assert overflowing == 0
        assert page.locator("a.md-footer__link--next").count() == 1
        assert page.locator("a.md-footer__link--prev").count() == 1
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / shot), full_page=False)
        context.close()
