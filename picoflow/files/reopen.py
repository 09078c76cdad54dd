"""``open_file``: the built-in tool through which a model reads again a file it now sees only as a reference.

A step is offered the tool when its request carries such a reference (and none of its own tools or server
tools has the name). The model names a file by the id the reference gives; only files of the step's own
history can be opened, never another id. Each opened file is attached to a message the framework adds after
the call's result, so the next request carries it in full, within the per-request file budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage

from picoflow.files.refs import FileRef, file_refs, with_files
from picoflow.messages import HumanMessageEx

if TYPE_CHECKING:
    from picoflow.messages import Owner

OPEN_FILE_TOOL = "open_file"
OPENED_TEXT = "The file '{name}' is attached to the next message."
SHOWN_TEXT = "The file you asked to open again."
UNKNOWN_TEXT = "No file with this id is part of this conversation; use the id a file reference gives."
TOO_LARGE_TEXT = "The file '{name}' is larger than one request may carry; it cannot be shown."
OVER_BUDGET_TEXT = "The file '{name}' does not fit in one request beside the files opened with it; open it alone."


def open_file_tool() -> dict[str, Any]:
    """The tool's OpenAI-style description, as handed to ``bind_tools``."""
    return {
        "type": "function",
        "function": {
            "name": OPEN_FILE_TOOL,
            "description": "Show again a file of this conversation that is now only referenced by its id.",
            "parameters": {
                "type": "object",
                "properties": {"file_id": {"type": "string", "description": "The id the file's reference gives."}},
                "required": ["file_id"],
                "additionalProperties": False,
            },
        },
    }


class FileOpening:
    """The ``open_file`` calls of one model answer: a tool result for each, then one message carrying the files.

    ``history`` is the step's memory (only its files can be opened); ``budget`` bounds the bytes opened together.
    """

    def __init__(self, history: list[BaseMessage], budget: int, owner: Owner) -> None:
        self._known = {ref.id: ref for message in history for ref in file_refs(message.content)}
        self._budget = budget
        self._owner = owner
        self._opened: dict[str, FileRef] = {}

    def answer(self, args: Mapping[str, Any]) -> tuple[str, str]:
        """The result of one call (its text and its status, ``success`` or ``error``)."""
        file_id = args.get("file_id")
        ref = self._known.get(file_id) if isinstance(file_id, str) else None
        if ref is None:
            return UNKNOWN_TEXT, "error"
        if ref.size > self._budget:
            return TOO_LARGE_TEXT.format(name=ref.name), "error"
        if ref.id not in self._opened:
            if ref.size + sum(opened.size for opened in self._opened.values()) > self._budget:
                return OVER_BUDGET_TEXT.format(name=ref.name), "error"
            self._opened[ref.id] = ref
        return OPENED_TEXT.format(name=ref.name), "success"

    def messages(self) -> list[BaseMessage]:
        """The message that carries the opened files (none when nothing was opened)."""
        if not self._opened:
            return []
        content: list[str | dict[str, Any]] = [*with_files(SHOWN_TEXT, self._opened.values())]
        return [HumanMessageEx(self._owner, content, origin="framework")]
