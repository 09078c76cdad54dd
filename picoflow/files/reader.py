"""File references become the provider's own content parts, only in the request a model is sent.

A reference is turned into LangChain's standard data block (``image`` or ``file`` with base64 data), which
each provider package converts to its API's part: OpenAI image_url and file parts, Anthropic and Bedrock
image and document blocks, Gemini inline data. The stored messages keep the references.
"""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage

from picoflow.deadline import time_left
from picoflow.errors import FileRefusedError, FileStoreError
from picoflow.files.refs import IMAGE_TYPES, FileRef, is_file_part, part_ref

if TYPE_CHECKING:
    from picoflow.run_context import TurnFiles

GONE_TEXT = "[The attached file '{name}' is no longer available.]"


def has_file_parts(messages: list[BaseMessage]) -> bool:
    """Whether any message of ``messages`` references a file."""
    return any(isinstance(m.content, list) and any(is_file_part(p) for p in m.content) for m in messages)


async def with_file_parts(
    messages: list[BaseMessage], files: TurnFiles, accepted: frozenset[str], step_id: str
) -> list[BaseMessage]:
    """``messages`` with each file reference replaced by its bytes as a standard data block.

    A type the model does not read raises ``FileRefusedError`` (``FILE_TYPE_UNSUPPORTED``) before anything
    is fetched; fetching is bounded by what is left of the turn. A file the store no longer holds is named
    in a text part instead.
    """
    if not has_file_parts(messages):
        return messages
    refs = [ref for m in messages if isinstance(m.content, list) for ref in _refs(m.content)]
    if any(ref.content_type not in accepted for ref in refs):
        raise FileRefusedError(
            f"The model of step '{step_id}' cannot read one of the attached file types.",
            code="FILE_TYPE_UNSUPPORTED", status_code=415,
        )
    data = await _fetch(files, refs)
    converted = []
    for message in messages:
        if isinstance(message.content, list) and any(is_file_part(part) for part in message.content):
            content = [_provider_part(part, data) if is_file_part(part) else part for part in message.content]
            message = message.model_copy(update={"content": content})
        converted.append(message)
    return converted


def _refs(content: list[Any]) -> list[FileRef]:
    refs = [part_ref(part) for part in content if is_file_part(part)]
    return [ref for ref in refs if ref is not None]


async def _fetch(files: TurnFiles, refs: list[FileRef]) -> dict[str, bytes | None]:
    unique = {ref.id: ref for ref in refs}
    try:
        reads = await asyncio.wait_for(
            asyncio.gather(*(files.read(ref) for ref in unique.values())), time_left("reading attached files")
        )
    except TimeoutError:
        raise FileStoreError("Reading the attached files ran out of the turn's time.") from None
    return dict(zip(unique, reads, strict=True))


def _provider_part(part: dict[str, Any], data: dict[str, bytes | None]) -> dict[str, Any]:
    ref = part_ref(part)
    raw = data.get(ref.id) if ref is not None else None
    if ref is None or raw is None:
        return {"type": "text", "text": GONE_TEXT.format(name=part.get("name") or "file")}
    encoded = base64.b64encode(raw).decode("ascii")
    if ref.content_type in IMAGE_TYPES:
        return {"type": "image", "base64": encoded, "mime_type": ref.content_type}
    return {"type": "file", "base64": encoded, "mime_type": ref.content_type, "filename": ref.name}
