"""Prompt files kept beside the steps that use them, with ``{placeholder}`` templating."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


@lru_cache(maxsize=256)
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def load_prompt(name: str, near: str) -> str:
    """Read prompt file ``name`` from the folder of the module file ``near`` (pass ``__file__``); cached."""
    return _read((Path(near).resolve().parent / name).resolve())


def render(template: str, /, **values: Any) -> str:
    """Fill ``{name}`` placeholders; unknown ones stay visible so a missing value is easy to spot."""

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(values[key]) if key in values and values[key] is not None else match.group(0)

    return _PLACEHOLDER.sub(fill, template)


def prompt(file: str, near: str, /, **values: Any) -> str:
    """Load and render a prompt file in one call."""
    return render(load_prompt(file, near), **values)
