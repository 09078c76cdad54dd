"""Reading and merging JSON-like state: dotted paths and deep merges, the rules every state accessor shares."""

from __future__ import annotations

import copy
from typing import Any


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
