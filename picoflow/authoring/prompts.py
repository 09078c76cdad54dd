"""Prompt files kept beside the steps that use them, and placeholder templating for them.

A template names a value with ``{{name}}`` (spaces inside the braces are ignored, and the name may be any text
without braces), the syntax of the original framework's prompt files. The rule for the value:

* a string is inserted as it is;
* any other value is inserted as JSON, so ``0`` renders ``0``, ``False`` renders ``false``, ``""`` renders
  nothing, and dicts, lists and pydantic models render as JSON documents;
* a name with no value, or with the value ``None``, leaves its placeholder untouched, so a forgotten value
  stays visible in the rendered prompt instead of silently disappearing.

Text in braces that is not a placeholder, such as a JSON example, is left alone. The older single-brace form
``{name}`` (an identifier) is still filled when a value is given, with a ``DeprecationWarning`` once per template.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

_PLACEHOLDER = re.compile(r"\{\{\s*(?P<name>[^{}]*?)\s*\}\}|\{(?P<short>[A-Za-z_][A-Za-z0-9_.]*)\}")

# Templates already reported for the single-brace form: the warning is given once per file, not once per turn.
_warned: set[str] = set()


@lru_cache(maxsize=256)
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _path(name: str, near: str) -> Path:
    return (Path(near).resolve().parent / name).resolve()


def load_prompt(name: str, near: str) -> str:
    """Read prompt file ``name``, relative to the folder of the module file ``near`` (pass ``__file__``).

    Each file is read once per process and then served from a cache; a missing file raises
    ``FileNotFoundError``, so loading prompts at module level fails at import time.
    """
    return _read(_path(name, near))


def format_value(value: Any) -> str:
    """The text a placeholder is replaced with: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


def render(template: str, values: Mapping[str, Any] | None = None, /, **named: Any) -> str:
    """Fill the ``{{name}}`` placeholders of ``template``.

    Values come from the optional ``values`` mapping (for names that are not Python identifiers) and from
    keyword arguments, which win. Missing and ``None`` values keep their placeholder; falsy values such as
    ``0``, ``False`` and ``""`` are rendered (see the module documentation).
    """
    return _fill(template, {**(values or {}), **named}, "A prompt template")


def prompt(file: str, near: str, values: Mapping[str, Any] | None = None, /, **named: Any) -> str:
    """Load prompt file ``file`` next to module ``near`` and render it: ``load_prompt`` then ``render``."""
    path = _path(file, near)
    return _fill(_read(path), {**(values or {}), **named}, f"Prompt file {path}")


def _fill(template: str, values: Mapping[str, Any], source: str) -> str:
    short: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is None:
            name = match.group("short")
            if values.get(name) is not None:
                short.append(name)
        value = values.get(name)
        return match.group(0) if value is None else format_value(value)

    text = _PLACEHOLDER.sub(fill, template)
    if short and template not in _warned:
        _warned.add(template)
        warnings.warn(
            f"{source} uses the single-brace placeholder {{{short[0]}}}, which is deprecated; "
            f"write {{{{{short[0]}}}}} instead.",
            DeprecationWarning,
            stacklevel=3,
        )
    return text
