"""Reading JSON out of model text."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


def strip_fence(text: str) -> str:
    """The text inside a Markdown code fence, or the stripped text when there is none."""
    cleaned = text.strip()
    fenced = _FENCE.match(cleaned)
    return fenced.group(1).strip() if fenced else cleaned


def parse_json(text: str) -> Any | None:
    """Parse a model reply as JSON, tolerating a code fence; ``None`` when it is not JSON."""
    try:
        return json.loads(strip_fence(text))
    except ValueError:
        return None
