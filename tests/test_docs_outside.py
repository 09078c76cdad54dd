"""The pages a newcomer follows run where the newcomer is: in a folder of their own, with only PicoFlow installed.

Each track's pages run in order in one fresh folder outside the repository, in a separate Python process that
cannot import this repository's ``docs`` or ``flows`` (``python -I``: no working directory or PYTHONPATH on
``sys.path``). The python blocks and file blocks run as tests/test_docs_examples.py runs them (its ``run_page``,
copied beside the folder), so the shown outputs are compared the same way. A page's shell blocks run too:
``Terminal 1`` starts the server in the background, the ``Terminal 2`` blocks run in one shell, each compared
with the "Output" block after it (session ids, request ids, the port and the home folder normalised).
A track that builds a package ends with the reader's folder holding exactly the finished package the site
includes, file for file.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_docs_examples import DOCS, ROOT, Block, _snippet_lines, blocks, nav_pages, shown_text

#: The folders of pages (or single pages) that promise to run outside the repository; each runs in reading order
#: in one folder.
TRACKS = {
    "get-started": DOCS / "get-started",
    "basic": DOCS / "tutorials" / "basic",
    "support": DOCS / "tutorials" / "support",
    "hotel": DOCS / "tutorials" / "hotel",
    "decision-hotel": DOCS / "tutorials" / "decision-hotel.md",
}
#: Where a track's finished files are kept as a package the site includes, and the files of it the track leaves
#: out; the reader's folder must end equal to the rest.
FINISHED: dict[str, tuple[str, Path, set[str]]] = {
    "basic": ("signup", DOCS / "tutorials" / "basic", set()),
    "support": ("support", DOCS / "tutorials" / "support", set()),
    # The repository's own judge fixtures (a scripted judge, the original demo's replies and judgements).
    "hotel": ("hotel", ROOT / "flows" / "hotel", {"judge_script.json", "original_judge.json", "original_replies.json"}),
}
_MARK = "@@block-done@@"
_IMPORT_FROM_REPO = re.compile(r"^\s*(?:from|import)\s+(?:docs|flows|handlers|tests)\b", re.MULTILINE)


def _normalise(text: str, port: int, home: Path) -> list[str]:
    text = text.replace(f"127.0.0.1:{port}", "127.0.0.1:8000").replace(str(home), "/home/you")
    text = re.sub(r"\b[0-9a-f]{32}\b", "<session>", text)
    text = re.sub(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<request>", text)
    return [line.rstrip() for line in text.strip().splitlines()]


def _is_saved(title: str) -> bool:
    """Whether a block titled ``title`` is a file the reader saves (its title is a relative file name)."""
    return re.match(r"^[\w./-]+\.\w+$", title) is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _shell_blocks(page: Path) -> list[tuple[Block, Block | None]]:
    found = blocks(page)
    pairs = []
    for index, block in enumerate(found):
        if block.lang == "bash" and block.title in ("Terminal 1", "Terminal 2"):
            following = found[index + 1] if index + 1 < len(found) else None
            shown = following if following is not None and following.title == "Output" else None
            pairs.append((block, shown))
    return pairs


def _run_python_blocks(page: Path, folder: Path, checker: Path, env: dict[str, str]) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(checker)!r})\n"
        "import docs_check\n"
        f"print(dict(docs_check.run_page(Path({str(page)!r}), Path({str(folder)!r}))))\n"
    )
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=folder, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{page.relative_to(DOCS)} outside the repository:\n{result.stderr[-4000:]}"


def _run_shell_blocks(page: Path, folder: Path, env: dict[str, str], home: Path) -> int:
    pairs = _shell_blocks(page)
    if not pairs:
        return 0
    port = _free_port()

    def local(command: str) -> str:
        return command.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
            "picoflow serve", f"picoflow serve --port {port}")

    servers = [block for block, _ in pairs if block.title == "Terminal 1"]
    assert len(servers) == 1, "one server per page"
    server_block, server_shown = next(pair for pair in pairs if pair[0].title == "Terminal 1")
    log = folder.parent / f"{page.stem}-server.log"
    with log.open("w") as out:
        # Its own process group: the shell and the server it starts are stopped together.
        server = subprocess.Popen(["bash", "-c", local(server_block.body.strip())], cwd=folder, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
        if server_shown is not None:
            assert _normalise(log.read_text(), port, home)[: len(server_shown.body.splitlines())] == _normalise(
                server_shown.body, port, home)
        clients = [(block, shown) for block, shown in pairs if block.title == "Terminal 2"]
        script = "set -e\n" + "".join(f"{local(block.body)}\necho {_MARK}\n" for block, _ in clients)
        result = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs = result.stdout.split(_MARK + "\n")
        for (block, shown), printed in zip(clients, outputs, strict=False):
            if shown is not None:
                assert _normalise(printed, port, home) == _normalise(shown.body, port, home), (
                    f"{page.relative_to(DOCS)}:{block.line} printed\n{printed}\nwhere the page shows\n{shown.body}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    return len(pairs)


@pytest.mark.parametrize("track", sorted(TRACKS))
def test_the_track_runs_in_a_folder_of_ones_own(track: str, tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT)
    folder = tmp_path / "my-project"
    folder.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    checker = tmp_path / "checker"
    checker.mkdir()
    shutil.copy2(ROOT / "tests" / "test_docs_examples.py", checker / "docs_check.py")
    venv_bin = str(Path(sys.executable).parent)
    # DOCS_SOURCE_ROOT: where the checker reads what a --8<-- line shows on the built page (never on sys.path).
    env = {"PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home), "LANG": "C.UTF-8",
           "DOCS_SOURCE_ROOT": str(ROOT)}
    pages = [page for page in nav_pages() if TRACKS[track] in (page, page.parent)]
    assert pages
    shell_blocks = 0
    for page in pages:
        name = page.relative_to(DOCS)
        for block in blocks(page):
            if block.lang == "python":
                assert not _IMPORT_FROM_REPO.search(block.body), f"{name}:{block.line} imports from the repository"
                # Included code is a whole file the reader saves, or labelled with the file it comes from.
                assert _snippet_lines(block.body) is None or block.title, f"{name}:{block.line} has no file label"
        _run_python_blocks(page, folder, checker, env)
        shell_blocks += _run_shell_blocks(page, folder, env, home)
    if track == "get-started":
        assert shell_blocks == 6
    if track == "basic":
        # The opening page counts the parts in words (an index page and eighteen parts) and lists, for each file
        # of the package, the parts that have the reader save it.
        opening = pages[0].read_text(encoding="utf-8")
        assert "Over eighteen short parts" in opening and len(pages) == 1 + 18
        rows = re.findall(r"^\| `(signup/[\w./]*)` \| .* \| ([\d, ]+) \|$", opening, re.MULTILINE)
        saving = {(block.title, int(page.name[:2])) for page in pages[1:] for block in blocks(page) if block.title}
        listed = {name: {int(part) for part in parts.split(",")} for name, parts in rows}
        assert listed and listed == {name: {part for title, part in saving if title.startswith(name)}
                                     for name in listed}
        assert {title for title, _ in saving if "/" in title and not title.startswith("In ")} == {
            title for title, _ in saving if any(title.startswith(name) for name in listed)}
    # Only what the pages told the reader to save: nothing else is written into their folder.
    written = {path.relative_to(folder).as_posix() for path in folder.rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    saved = {block.title for page in pages for block in blocks(page) if block.title and _is_saved(block.title)}
    assert written == saved
    if track in FINISHED:
        package, source, left_out = FINISHED[track]
        # Built page by page, the reader's package ends as the finished one: same files, same text.
        # The finished files as the site shows them (without the section markers the pages include parts by).
        finished = {path.relative_to(source).as_posix(): shown_text(path.relative_to(ROOT).as_posix(), None)
                    for path in source.rglob("*") if path.is_file() and "__pycache__" not in path.parts
                    and not (path.suffix == ".md" and path.parent == source and source.is_relative_to(DOCS))
                    and path.relative_to(source).as_posix() not in left_out}
        built = {path.relative_to(folder / package).as_posix(): path.read_text(encoding="utf-8")
                 for path in (folder / package).rglob("*") if path.is_file() and "__pycache__" not in path.parts}
        assert sorted(built) == sorted(finished)
        for name, text in finished.items():
            assert built[name] == text, f"{package}/{name} as the pages leave it differs from {source / name}"


#: Tutorial pages that read a flow bundled in the repository's flows/, so their examples run from a checkout
#: (docs/tutorials/index.md says which tracks run where the reader is). A new tutorial page joins a track above.
FROM_A_CHECKOUT = {"index.md", "employee-benefits.md", "home-insurance.md", "invoice.md", "northwind-support.md"}


def test_every_tutorial_page_runs_outside_or_is_known_to_need_a_checkout() -> None:
    tutorials = DOCS / "tutorials"
    for page in nav_pages():
        if not page.is_relative_to(tutorials) or {page, page.parent} & set(TRACKS.values()):
            continue
        assert page.relative_to(tutorials).parts[0] in FROM_A_CHECKOUT, f"{page.relative_to(DOCS)} runs nowhere"
        assert not any(block.title and _is_saved(block.title) for block in blocks(page)), (
            f"{page.relative_to(DOCS)} has the reader save a file: it belongs to a track that runs outside")
