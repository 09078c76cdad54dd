"""Every example in the docs runs: a page's blocks, checked the way the page says they behave.

The conventions (docs/reference/index.md, "How the examples are checked"):

* a ```python block runs, in page order, in one namespace per page, with the repository root as the working
  directory; top-level ``await`` is allowed (the page's blocks share one event loop);
* a ```python block whose first line is ``# fragment`` is only compiled, never run;
* a ```python block made of ``--8<-- "path:section"`` lines only shows code of a module (pymdownx.snippets): the
  section must exist and compile, and the module runs where a page imports it;
* a ```text block titled "Output" right after a python block is what that block prints, compared line by line;
* a ```json block's title says what it is, and it is validated by the model the code reads it with
  (``JSON_KINDS``); a json block without a known title fails;
* a block titled with a file name (``title="greeting.py"``, ``title="replies.json"``) is a file the reader saves:
  it is written into the page's folder, which is on ``sys.path``, so later blocks import it; a ``.py`` file followed
  by an "Output" block is also run as a script (``python greeting.py``) there and its output compared. A json
  file is validated by its name (``FILE_KINDS``).

``run_page(page, folder)`` runs a page in ``folder`` as the working directory; tests/test_docs_outside.py runs the
tutorial pages that way in a process that cannot import this repository's ``docs`` or ``flows``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import os
import re
import runpy
import sys
import tempfile
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from picoflow.aws.requests import FileUploadRequest, ReviewRequest, RunRequest
from picoflow.aws.responses import EndEnvelope, ReviewList, TurnEnvelope
from picoflow.aws.streams import StreamedTurn
from picoflow.aws.websocket import read_message
from picoflow.errors import public_message
from picoflow.local.scenario import Scenario
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import SessionDoc

# The sources a page's --8<-- lines include; tests/test_docs_outside.py runs a copy of this module elsewhere.
ROOT = Path(os.environ.get("DOCS_SOURCE_ROOT") or Path(__file__).resolve().parents[1])
DOCS = ROOT / "docs"
# Prompt files of the tutorial flows and the tables pages include (docs/_generated/) are Markdown too, but not
# pages (mkdocs.yml excludes them).
PAGES = sorted(page for page in DOCS.rglob("*.md") if not {"prompts", "_generated"} & set(page.relative_to(DOCS).parts))

# Filled as the pages run; tests/conftest.py prints it at the end of the run.
COUNTS: Counter[str] = Counter()

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.DOTALL | re.MULTILINE)
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')
# A section marker line in an included file; pymdownx.snippets leaves it out of the page.
_MARKER = re.compile(r"^[ \t]*# --8<-- \[(?:start|end):[\w-]+\][ \t]*$")
_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"$')


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    body: str
    line: int


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        title = _TITLE.search(match["attrs"])
        found.append(Block(
            lang=match["lang"], title=title["title"] if title else None,
            body=textwrap.dedent(match["body"]), line=text.count("\n", 0, match.start()) + 1,
        ))
    return found


def _conversation(data: Any) -> None:
    assert set(data) <= {"flow", "config", "turns"} and data["flow"] and data["turns"], "not a conversation file"
    ScriptedProvider([reply for turn in data["turns"] for reply in turn.get("replies", [])])
    assert all(isinstance(turn["user"], str) for turn in data["turns"])


def _catalog(data: Any) -> None:
    # A hotel catalog, as the hotel track's search server reads it: named hotels with amenities and room types.
    assert isinstance(data, list) and data, "not a catalog"
    assert all(isinstance(hotel["name"], str) and isinstance(hotel["amenities"], dict)
               and isinstance(hotel["roomType"], list) for hotel in data)


def _flow_names(data: Any) -> None:
    assert isinstance(data, list) and all(isinstance(name, str) for name in data), "not a list of flow names"


def _envelope_failure(data: Any) -> None:
    envelope = TurnEnvelope.model_validate(data)
    assert envelope.success is False and envelope.code and envelope.request_id
    # The page shows the code's own fixed sentence, not one of its own making.
    assert envelope.message == public_message(envelope.code), public_message(envelope.code)


def _websocket_message(data: Any) -> None:
    turn = read_message(json.dumps(data))
    assert isinstance(turn, StreamedTurn), f"the WebSocket handler refuses it: {turn}"


#: What a json block's title may say, and the check the code that reads such JSON would make.
JSON_KINDS: dict[str, Callable[[Any], Any]] = {
    "POST /ai/run request": RunRequest.model_validate,
    "POST /ai/run response": TurnEnvelope.model_validate,
    "POST /ai/run failure": _envelope_failure,
    "POST /ai/end response": EndEnvelope.model_validate,
    "POST /ai/files request": FileUploadRequest.model_validate,
    "GET /ai/flows response": _flow_names,
    "POST /ai/approvals request": ReviewRequest.model_validate,
    "GET /ai/approvals response": ReviewList.model_validate,
    "Scripted replies": ScriptedProvider,
    "Conversation": _conversation,
    "Scenario": Scenario.model_validate,
    "Session document": SessionDoc.model_validate,
    "WebSocket message": _websocket_message,
}


#: A file block's name (its title) and the check its content gets; any .py name is a module or script.
FILE_KINDS: dict[str, Callable[[Any], Any]] = {
    "replies.json": ScriptedProvider,
    "conversation.json": _conversation,
    "scenario.json": Scenario.model_validate,
    "hotels.json": _catalog,
}
_FILE_TITLE = re.compile(r"^[\w.-]+(?:/[\w.-]+)*\.(?:py|json|md|txt)$")


def _write_file(folder: Path, block: Block, where: str) -> Path:
    """Save a file block where the reader would, checking a json file by its name.

    A block made of ``--8<--`` lines shows the whole of the included files: that text is what the reader saves.
    """
    assert block.title is not None
    path = folder / block.title
    snippets = _snippet_lines(block.body)
    text = "".join(shown_text(m["path"], m["section"]) for m in snippets) if snippets else block.body
    if path.suffix == ".json":
        check = FILE_KINDS.get(path.name)
        assert check is not None, f"{where}: a json file block is one of {sorted(FILE_KINDS)}"
        check(json.loads(text))
    elif path.suffix == ".py":
        compile(text, where, "exec", dont_inherit=True)
        # A page may rewrite a module it saved before: the next import reads the new text. The whole package
        # is forgotten, as a fresh interpreter would have it, so its __init__ imports the new module too.
        top = path.relative_to(folder).with_suffix("").parts[0]
        for name in [name for name in sys.modules if name == top or name.startswith(f"{top}.")]:
            del sys.modules[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def is_file_block(block: Block) -> bool:
    """Whether ``block`` is a file the reader saves (its title is a relative file name)."""
    return bool(block.title and _FILE_TITLE.match(block.title))


def nav_pages() -> list[Path]:
    """The pages in the site's reading order (mkdocs.yml's nav)."""
    import yaml

    def walk(entry: Any) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [page for item in entry for page in walk(item)]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in walk(value)]
        return []

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [DOCS / page for page in walk(nav)]


def save_earlier_files(page: Path, folder: Path) -> None:
    """Save the file blocks of the pages before ``page`` in its folder of the site, as a reader would have."""
    order = [other for other in nav_pages() if other.parent == page.parent]
    for earlier in order[: order.index(page)] if page in order else []:
        for block in blocks(earlier):
            if is_file_block(block):
                _write_file(folder, block, f"{earlier.name}:{block.line}")


def shown_text(path: str, section: str | None) -> str:
    """What a ``--8<-- "path:section"`` line shows on the built page: the text without section markers."""
    source = (ROOT / path).read_text(encoding="utf-8")
    if section is not None:
        start, end = f"# --8<-- [start:{section}]\n", f"# --8<-- [end:{section}]"
        assert start in source and end in source, f"{path} has no section {section!r}"
        source = source.split(start, 1)[1].split(end, 1)[0]
    return "".join(line for line in source.splitlines(keepends=True) if not _MARKER.match(line))


def _snippet_lines(body: str) -> list[re.Match[str]] | None:
    lines = [line for line in body.splitlines() if line.strip()]
    matches = [_SNIPPET.match(line.strip()) for line in lines]
    return matches if lines and all(matches) else None  # type: ignore[return-value]


def _compile(source: str, name: str) -> Any:
    return compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def run_page(page: Path, folder: Path | None = None) -> Counter[str]:
    """Check every block of ``page``; the counts of python blocks run, fragments, inclusions and json checked.

    File blocks are saved into ``folder`` (a fresh temporary one when None), which is put first on ``sys.path``.
    """
    counts: Counter[str] = Counter()
    found = blocks(page)
    namespace: dict[str, Any] = {"__name__": f"docs_page_{page.stem.replace('-', '_')}"}
    folder = Path(tempfile.mkdtemp(prefix="docs-page-")) if folder is None else folder
    sys.path.insert(0, str(folder))
    loop = asyncio.new_event_loop()
    try:
        for index, block in enumerate(found):
            where = f"{page.name}:{block.line}"
            following = found[index + 1] if index + 1 < len(found) else None
            shows_output = following is not None and following.lang == "text" and following.title == "Output"
            if is_file_block(block):
                path = _write_file(folder, block, where)
                counts["file"] += 1
                if path.suffix != ".py" or not shows_output:
                    continue
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed), contextlib.chdir(folder):
                    runpy.run_path(str(path), run_name="__main__")
                counts["executed"] += 1
            elif block.lang == "json":
                # "In signup/conversation.json": a file saved earlier, shown again; checked by the file's name.
                named = block.title.removeprefix("In ").rsplit("/", 1)[-1] if block.title else None
                check = JSON_KINDS.get(block.title or "") or FILE_KINDS.get(named or "")
                assert check is not None, f"{where}: a json block needs a title among {sorted(JSON_KINDS)}"
                snippets = _snippet_lines(block.body)
                text = "".join(shown_text(m["path"], m["section"]) for m in snippets) if snippets else block.body
                check(json.loads(text))
                counts["json"] += 1
                continue
            elif block.lang != "python":
                continue
            else:
                snippets = _snippet_lines(block.body)
                if snippets:
                    for match in snippets:
                        _compile(textwrap.dedent(shown_text(match["path"], match["section"])), where)
                    counts["included"] += 1
                    continue
                code = _compile(block.body, where)
                if block.body.startswith("# fragment"):
                    counts["fragment"] += 1
                    continue
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    result = eval(code, namespace)  # noqa: S307 - the docs' own examples
                    if asyncio.iscoroutine(result):
                        loop.run_until_complete(result)
                counts["executed"] += 1
            if following is not None and shows_output:
                shown = [line.rstrip() for line in following.body.rstrip().splitlines()]
                assert [line.rstrip() for line in printed.getvalue().rstrip().splitlines()] == shown, (
                    f"{where}: the block printed\n{printed.getvalue()}\nwhere the page shows\n{following.body}"
                )
                counts["output"] += 1
    finally:
        sys.path.remove(str(folder))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return counts


@pytest.fixture
def repository_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    for variable in ("PICOFLOW_SCRIPT", "PICOFLOW_FLOWS", "SESSION_STORE"):
        monkeypatch.delenv(variable, raising=False)
    return ROOT


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(DOCS)) for page in PAGES])
def test_the_examples_of_the_page_run_as_shown(
    page: Path, repository_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A track's pages build on the files its earlier pages had the reader save, and run where those files are.
    save_earlier_files(page, tmp_path)
    if any(is_file_block(block) for other in page.parent.glob("*.md") for block in blocks(other)):
        monkeypatch.chdir(tmp_path)
    counts = run_page(page, tmp_path)
    COUNTS.update(counts)
    COUNTS["pages"] += 1


def test_the_conventions_are_applied_somewhere() -> None:
    # Without any of each, a broken collector (a fence pattern that matches nothing) would pass everything.
    kinds: Counter[str] = Counter()
    for page in PAGES:
        for block in blocks(page):
            kinds[block.lang] += 1
            kinds["fragment"] += block.lang == "python" and block.body.startswith("# fragment")
            kinds["output"] += block.lang == "text" and block.title == "Output"
            kinds["snippet"] += block.lang == "python" and _snippet_lines(block.body) is not None
    assert kinds["python"] > 40 and kinds["json"] >= 5 and kinds["fragment"] and kinds["output"] >= 5
    assert kinds["snippet"] >= 10


def summary() -> str | None:
    """The closing line of a run that checked pages, for ``pytest_terminal_summary``."""
    if not COUNTS["pages"]:
        return None
    return (
        f"docs examples: {COUNTS['pages']} pages, {COUNTS['executed']} python blocks executed "
        f"({COUNTS['output']} with their output compared), {COUNTS['fragment']} fragments compiled, "
        f"{COUNTS['included']} included from tested modules, {COUNTS['json']} json blocks validated"
    )


if __name__ == "__main__":  # pragma: no cover - a quick look at one page: python tests/test_docs_examples.py PAGE
    sys.path.insert(0, str(ROOT))
    print(run_page(Path(sys.argv[1]).resolve()))
