"""Prompt files resolve beside the calling module, are cached, and keep unknown placeholders visible."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from picoflow.authoring.prompts import load_prompt, prompt, render

SINGLE_BRACE = re.compile(r"(?<!\{)\{[A-Za-z_][A-Za-z0-9_.]*\}(?!\})")


def test_prompt_files_resolve_next_to_the_module_and_are_cached(tmp_path: Path):
    module = tmp_path / "steps.py"
    module.write_text("# a step module\n")
    (tmp_path / "greet.md").write_text("Hello {name}, welcome to {place}. Keep {unknown} as is.")
    assert prompt("greet.md", str(module), name="Ada", place="PicoFlow") == (
        "Hello Ada, welcome to PicoFlow. Keep {unknown} as is."
    )
    (tmp_path / "greet.md").write_text("changed")
    assert load_prompt("greet.md", str(module)).startswith("Hello")  # read once, then served from the cache


def test_render_leaves_missing_and_none_values_visible():
    assert render("{a} {b} {c.d}", a=1, b=None) == "1 {b} {c.d}"
    assert render("JSON like {\"x\": 1} is untouched", x=2) == "JSON like {\"x\": 1} is untouched"


def test_the_single_brace_form_still_fills_with_one_warning_per_file(tmp_path: Path):
    module = tmp_path / "steps.py"
    module.write_text("# a step module\n")
    (tmp_path / "old.md").write_text("Hello {name}, from {{place}}.")
    with pytest.warns(DeprecationWarning, match=r"old\.md uses the single-brace placeholder \{name\}.*\{\{name\}\}"):
        assert prompt("old.md", str(module), name="Ada", place="PicoFlow") == "Hello Ada, from PicoFlow."
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prompt("old.md", str(module), name="Bo", place="Oslo") == "Hello Bo, from Oslo."


def test_the_documented_form_and_unfilled_braces_never_warn(tmp_path: Path):
    module = tmp_path / "steps.py"
    module.write_text("# a step module\n")
    (tmp_path / "new.md").write_text("Hello {{name}}; a literal {example} stays.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prompt("new.md", str(module), name="Ada") == "Hello Ada; a literal {example} stays."


def test_the_bundled_prompt_files_use_the_documented_form_only():
    bundled = sorted((Path(__file__).resolve().parents[1] / "flows").rglob("*.md"))
    assert bundled
    for path in bundled:
        assert not SINGLE_BRACE.search(path.read_text(encoding="utf-8")), path
