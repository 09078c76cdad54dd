"""The documentation site builds strictly (no broken link, reference or include), quietly, and renders in Chromium.

``zensical build --strict --clean`` runs once for the module on a copy of what the site is made from (mkdocs.yml,
docs/, and the packages its reference and includes read) in a temporary folder, as Zensical writes the site and
its cache inside the folder of its configuration. The built folder is then served on a loopback port and pages are
opened in Debian's Chromium (screenshots go to ``ignore/screenshots/``, as the other browser tests' do).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.browser import SCREENSHOTS, launched_chromium
from tests.test_docs_examples import DOCS, nav_pages

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_SECONDS = 300
PAGE_TIMEOUT_MS = 30_000

#: What the site is built from: the configuration, the pages, and what the pages' reference and includes read.
SOURCES = ("mkdocs.yml", "docs", "picoflow", "flows")

#: Everything a build that finds nothing to report prints, line by line: its progress on stdout, its verdict on
#: stderr. A warning, a notice or a note from an extension is a line more, and fails the build test.
QUIET_STDOUT = (re.compile(r"Build started"), re.compile(r"Build finished in \d+(\.\d+)?m?s"))
QUIET_STDERR = ("No issues found",)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Build:
    """A finished ``zensical build``: its exit status and the lines it printed on each stream."""

    returncode: int
    stdout: list[str]
    stderr: list[str]
    site: Path


def copy_sources(folder: Path) -> Path:
    """Copy what the site is built from into ``folder``; the project folder of the copy."""
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, folder / name)
    return folder


def build(project: Path) -> Build:
    """Build the site of ``project`` strictly, from a clean cache, as ``make docs`` would serve it."""
    result = subprocess.run(
        [sys.executable, "-m", "zensical", "build", "--strict", "--clean"],
        cwd=project, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS,
    )

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in _ANSI.sub("", text).splitlines() if line.strip()]

    site_dir = yaml.safe_load((project / "mkdocs.yml").read_text(encoding="utf-8"))["site_dir"]
    return Build(result.returncode, lines(result.stdout), lines(result.stderr), project / site_dir)


@pytest.fixture(scope="module")
def site_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    started = time.monotonic()
    built = build(copy_sources(tmp_path_factory.mktemp("docs-project")))
    assert built.returncode == 0, "\n".join(built.stdout + built.stderr)
    print(f"zensical build --strict --clean: {time.monotonic() - started:.1f} s")
    return built


@pytest.fixture(scope="module")
def site(site_build: Build) -> Path:
    return site_build.site


def test_the_build_prints_its_progress_and_nothing_else(site_build: Build) -> None:
    assert len(site_build.stdout) == len(QUIET_STDOUT), site_build.stdout
    for line, pattern in zip(site_build.stdout, QUIET_STDOUT, strict=True):
        assert pattern.fullmatch(line), site_build.stdout
    assert tuple(site_build.stderr) == QUIET_STDERR, site_build.stderr


def test_strict_mode_fails_the_build_on_a_broken_link(tmp_path: Path) -> None:
    # Strictness is the builder's, not the test's: a link to a page that does not exist stops the build.
    project = copy_sources(tmp_path)
    page = project / "docs" / "differences.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](no-such-page.md).\n", encoding="utf-8")
    broken = build(project)
    assert broken.returncode != 0
    assert any("page does not exist" in line for line in broken.stdout + broken.stderr), broken.stderr


def test_the_layout_page_names_the_pins_pyproject_makes() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    page = " ".join((ROOT / "docs" / "concepts" / "layout.md").read_text(encoding="utf-8").split())
    for requirement in extras["docs"]:
        name, pins = re.match(r"^([\w-]+)(?:\[\w+\])?(.*)$", requirement).groups()  # type: ignore[union-attr]
        assert f"`{pins}`" in page, f"docs/concepts/layout.md does not name {name}'s pins {pins}"


def test_every_page_of_the_navigation_is_built(site: Path) -> None:
    pages = nav_pages()
    assert len(pages) > 80
    for page in pages:
        relative = page.relative_to(DOCS).with_suffix("")
        folder = relative.parent if relative.name == "index" else relative
        assert (site / folder / "index.html").is_file(), page
    # The files the pages include are not pages of their own.
    assert not (site / "_generated").exists()


def test_the_configuration_page_shows_the_template_parameters_table(site: Path) -> None:
    page = (site / "reference/configuration/index.html").read_text(encoding="utf-8")
    assert "--8&lt;--" not in page and "--8<--" not in page
    included = (ROOT / "docs" / "_generated" / "template-parameters.md").read_text(encoding="utf-8")
    default = re.search(r"^\| `SessionRetentionSeconds` \| `(\d+)` \|", included, re.MULTILINE)
    assert default, "the include has no SessionRetentionSeconds row"
    assert re.search(rf"<td><code>SessionRetentionSeconds</code></td>\s*<td><code>{default[1]}</code></td>", page)


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
        requested: list[str] = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.on("request", lambda request: requested.append(request.url))
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
    # No web font, script or stylesheet from elsewhere: the page renders the same offline.
    assert [url for url in requested if not url.startswith((served, "data:"))] == [], requested


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


def test_search_finds_a_reference_entry_from_the_sites_own_index(served: str) -> None:
    with launched_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        page = context.new_page()
        failed: list[str] = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.goto(served + "/", wait_until="load")
        page.locator("button.md-search__button").first.click()
        page.keyboard.type("ScriptedProvider")
        results = page.get_by_role("listbox", name="Search results").get_by_role("option")
        results.first.wait_for()
        # The class's own entry on the models reference page is among the answers.
        hrefs = [results.nth(index).get_attribute("href") or "" for index in range(results.count())]
        assert any("/reference/models/" in href and href.endswith("#picoflow.models.scripted.ScriptedProvider")
                   for href in hrefs), hrefs
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "docs-search.png"), full_page=False)
        context.close()
    # Everything the search needs (its index and worker) comes from the site itself.
    assert failed == [], failed
