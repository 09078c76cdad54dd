"""Step and flow state: reading a dotted path, deep-merging a write, and the state keys the framework owns."""

from __future__ import annotations

import copy
from typing import Any

#: State keys the framework owns: a step's transient data (never persisted), its prompt and its save time.
TRANSIENT_KEY = "_transient"
PROMPT_KEY = "_prompt"
SAVE_ON_KEY = "_saveOn"


def read_path(data: Any, path: str | None) -> Any:
    """Read a dotted path (``a.b.0.c``) from nested dicts and lists; ``None`` when absent."""
    if path is None:
        return data
    current = data
    for part in path.split("."):
        if isinstance(current, dict):
            current = current.get(part)
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
        if current is None:
            return None
    return current


def deep_merge(target: dict[str, Any], incoming: dict[str, Any]) -> dict[str, Any]:
    """Merge ``incoming`` into ``target`` in place: nested dicts merge, everything else replaces."""
    for key, value in incoming.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target

