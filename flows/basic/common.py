"""Prompt text and small helpers shared by several BasicFlow steps."""

from __future__ import annotations

from typing import Any

from picoflow import TerminateSessionStep, Transition, go, tool
from picoflow.authoring.prompts import load_prompt
from picoflow.parsing import parse_json

ROLE = load_prompt("role.md", __file__).strip()
ABRUPT_END = load_prompt("abrupt_end.md", __file__).strip()
ADDRESS_END = load_prompt("address_end.md", __file__).strip()



class ExitOnRequest:
    """Mix into a conversational step to offer ``terminate_session``.

    The tool itself is defined once, by the framework's ``TerminateSessionStep``; decorating a handler
    here is what puts it on this step's menu.
    """

    @tool
    async def terminate_session(self, args: dict[str, Any]) -> Transition:
        return go(TerminateSessionStep).with_prompt(ABRUPT_END)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """Parse a model reply as one JSON object, tolerating a Markdown code fence; ``None`` otherwise."""
    value = parse_json(text)
    # A JSON array or scalar parses fine but is not an answer we can use.
    return value if isinstance(value, dict) else None
