"""Prompt files resolve beside the calling module, are cached, and keep unknown placeholders visible."""

from __future__ import annotations

from pathlib import Path

from picoflow.prompts import load_prompt, prompt, render


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
