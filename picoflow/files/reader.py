"""File references become the provider's own content parts, only in the request a model is sent, and only once
per step visit: afterwards a file is a short reference the model can open again (``picoflow.files.reopen``).

A file sent in full is turned into LangChain's standard data block (``image`` or ``file`` with base64 data),
which each provider package converts to its API's part: OpenAI image_url and file parts, Anthropic and Bedrock
image and document blocks, Gemini inline data. The stored messages keep the references.

When a step's model has answered after a file's message in an earlier turn, it has read the file: later
requests of that visit carry the reference instead. A visit ends when another step's model answers in the
same memory, so the next step's model gets the files of the history in full once. Within a turn a step's
model keeps getting what it got in full at the turn's first call (a tool loop reads the same request). Files
sent in full never exceed the turn's per-request budget, newest first; the others become references.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from picoflow.deadline import time_left
from picoflow.errors import FileRefusedError, FileStoreError
from picoflow.files.refs import IMAGE_TYPES, FileRef, is_file_part, part_ref
from picoflow.files.reopen import OPEN_FILE_TOOL
from picoflow.files.turn_files import TurnFiles
from picoflow.messages import is_direct, message_step

GONE_TEXT = "[The attached file '{name}' is no longer available.]"
REFERENCE_TEXT = "[File '{name}' ({type}, {size}) was shown earlier in this conversation.]"
OPENABLE_TEXT = (
    "[File '{name}' ({type}, {size}) was shown earlier in this conversation; to read it again, call "
    + OPEN_FILE_TOOL + " with file_id \"{id}\".]"
)
TOO_LARGE_TEXT = "[File '{name}' ({type}, {size}) is larger than one request may carry, so it is not shown.]"


@dataclass
class FileRequest:
    """A model request with its files resolved, and whether it names a file the model may open again."""

    messages: list[BaseMessage]
    openable: bool = False


def has_file_parts(messages: list[BaseMessage]) -> bool:
    """Whether any message of ``messages`` references a file."""
    return any(isinstance(m.content, list) and any(is_file_part(p) for p in m.content) for m in messages)


async def with_file_parts(
    messages: list[BaseMessage], files: TurnFiles, accepted: frozenset[str], step_id: str, namespace: str,
    *, can_open: bool = False,
) -> FileRequest:
    """``messages`` with each file reference replaced by its bytes, or by a reference line once its step has read it.

    A type the model does not read raises ``FileRefusedError`` (``FILE_TYPE_UNSUPPORTED``) before anything
    is fetched; fetching is bounded by what is left of the turn. A file the store no longer holds is named
    in a text part instead. ``can_open``: the step offers ``open_file``, so reference lines invite its use.
    """
    if not has_file_parts(messages):
        return FileRequest(messages)
    newest = _newest_parts(messages)
    if any(ref.content_type not in accepted for ref, _ in newest.values()):
        raise FileRefusedError(
            f"The model of step '{step_id}' cannot read one of the attached file types.",
            code="FILE_TYPE_UNSUPPORTED", status_code=415,
        )
    shown = files.shown.setdefault((step_id, namespace), set())
    read_until = _read_until(messages, step_id)
    full: list[FileRef] = []
    used = 0
    # Newest first: the user's latest files are the ones a budget too small for all of them keeps.
    for ref, (index, _) in sorted(newest.values(), key=lambda item: item[1], reverse=True):
        if (ref.id in shown or index > read_until) and used + ref.size <= files.budget:
            full.append(ref)
            used += ref.size
    data = await _fetch(files, full)
    shown.update(ref.id for ref in full if data[ref.id] is not None)
    openable = False
    converted = []
    for index, message in enumerate(messages):
        if isinstance(message.content, list) and any(is_file_part(part) for part in message.content):
            content = []
            for position, part in enumerate(message.content):
                if not isinstance(part, dict) or not is_file_part(part):
                    content.append(part)
                    continue
                found = part_ref(part)
                if found is not None and found.id in data and newest[found.id][1] == (index, position):
                    content.append(_provider_part(found, data[found.id]))
                    continue
                text, could_open = _reference(part, found, files.budget, can_open)
                openable = openable or could_open
                content.append({"type": "text", "text": text})
            message = message.model_copy(update={"content": content})
        converted.append(message)
    return FileRequest(converted, openable)


def _newest_parts(messages: list[BaseMessage]) -> dict[str, tuple[FileRef, tuple[int, int]]]:
    """Each referenced file with the position (message, part) of its newest reference."""
    newest: dict[str, tuple[FileRef, tuple[int, int]]] = {}
    for index, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for position, part in enumerate(message.content):
            ref = part_ref(part) if isinstance(part, dict) and is_file_part(part) else None
            if ref is not None:
                newest[ref.id] = (ref, (index, position))
    return newest


def _read_until(messages: list[BaseMessage], step_id: str) -> int:
    """The index up to which ``step_id``'s model has read: its last answer, when no other step's model answered
    after it (a direct reply is nobody's reading); -1 when this is the start of its visit."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage) and not is_direct(message):
            return index if message_step(message) == step_id else -1
    return -1


def _reference(part: dict[str, Any], ref: FileRef | None, budget: int, can_open: bool) -> tuple[str, bool]:
    """The line standing for a file not sent in full, and whether it invites the model to open the file."""
    if ref is None:
        return GONE_TEXT.format(name=part.get("name") or "file"), False
    values = {"name": ref.name, "type": ref.content_type, "size": _size(ref.size), "id": ref.id}
    if ref.size > budget:
        return TOO_LARGE_TEXT.format(**values), False
    return (OPENABLE_TEXT if can_open else REFERENCE_TEXT).format(**values), can_open


def _size(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:,.0f} KB"


async def _fetch(files: TurnFiles, refs: list[FileRef]) -> dict[str, bytes | None]:
    if not refs:
        return {}
    try:
        reads = await asyncio.wait_for(
            asyncio.gather(*(files.read(ref) for ref in refs)), time_left("reading attached files")
        )
    except TimeoutError:
        raise FileStoreError("Reading the attached files ran out of the turn's time.") from None
    return {ref.id: raw for ref, raw in zip(refs, reads, strict=True)}


def _provider_part(ref: FileRef, raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {"type": "text", "text": GONE_TEXT.format(name=ref.name)}
    encoded = base64.b64encode(raw).decode("ascii")
    if ref.content_type in IMAGE_TYPES:
        return {"type": "image", "base64": encoded, "mime_type": ref.content_type}
    return {"type": "file", "base64": encoded, "mime_type": ref.content_type, "filename": ref.name}
