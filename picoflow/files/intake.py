"""Opening uploads and taking a turn's files: every check of the files runs before anything is stored, and
inline files are stored only once the turn has passed the session's checks too (``store_inline``).

A file id is usable only by the principal (and, when it was uploaded for one, the session) that created it,
before its record expires; any other id is refused exactly like an unknown one. Each refusal is a
``FileRefusedError`` whose code has a fixed sentence and status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from picoflow.deadline import time_left
from picoflow.errors import FileRefusedError, FileStoreError
from picoflow.files.policy import FilePolicy
from picoflow.files.refs import FileRef, digest_of, is_file_id, new_file_id, safe_name, sniff_type
from picoflow.files.store import FileRecord, FileStore, UploadTicket, owner_tag


class InlineFile(BaseModel):
    """A small file sent inside ``POST /ai/run``: its name, declared type and base64 bytes."""

    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(min_length=1, description="Shown to the model; a long name is cut to 255 UTF-8 bytes.")
    content_type: str = Field(alias="contentType", min_length=1, max_length=255)
    data: str = Field(description="The file's bytes, base64-encoded.")


@dataclass
class TakenFiles:
    """A turn's files: their references in order, the bytes read or decoded while checking them (keyed by id),
    and the records of the inline ones, which are not stored yet (see ``store_inline``)."""

    refs: list[FileRef] = field(default_factory=list)
    data: dict[str, bytes] = field(default_factory=dict)
    inline: list[FileRecord] = field(default_factory=list)


def refuse(code: str, status_code: int = 400) -> FileRefusedError:
    """The refusal for ``code`` (its client-facing sentence is the code's fixed one)."""
    return FileRefusedError(f"File refused: {code}", code=code, status_code=status_code)


def _check_declared(policy: FilePolicy, content_type: str, size: int) -> str:
    kind = content_type.split(";")[0].strip().lower()
    if kind not in policy.allowed_types:
        raise refuse("FILE_TYPE_NOT_ALLOWED", 415)
    if size > policy.max_file_bytes:
        raise refuse("FILE_TOO_LARGE", 413)
    return kind


def _check_content(data: bytes, content_type: str, size: int) -> None:
    if len(data) != size or sniff_type(data) != content_type:
        raise refuse("FILE_CONTENT_MISMATCH", 415)


async def open_upload(
    store: FileStore,
    policy: FilePolicy,
    *,
    name: str,
    content_type: str,
    size: int,
    caller: str | None,
    session_id: str | None,
) -> UploadTicket:
    """Check a declared upload and answer where to send it; the file is bound to ``caller`` and ``session_id``."""
    kind = _check_declared(policy, content_type, size)
    if size <= 0:
        raise refuse("FILE_CONTENT_MISMATCH", 415)
    record = FileRecord(
        id=new_file_id(), name=safe_name(name), content_type=kind, size=size, owner=owner_tag(caller),
        session=session_id or "", expires_at=int(time.time()) + policy.use_seconds,
    )
    return await store.presign_upload(record, policy.upload_seconds)


async def take_files(
    store: FileStore,
    policy: FilePolicy,
    *,
    file_ids: Sequence[str] = (),
    inline: Sequence[InlineFile] = (),
    caller: str | None,
    session_id: str | None,
) -> TakenFiles:
    """Check every file of a turn (count, sizes, types, content, owner, expiry); nothing is stored here.

    Uploaded files are read whole (one GET each, at most ``max_file_bytes``) to check their content and
    digest; those bytes seed the turn's cache, so the model call does not read them again. Inline files get
    their ids and records here, and are stored by ``store_inline`` once the turn is known to run.
    """
    if len(file_ids) + len(inline) > policy.max_files:
        raise refuse("TOO_MANY_FILES")
    taken = TakenFiles()
    total = 0
    decoded: list[tuple[InlineFile, str, bytes]] = []
    inline_total = 0
    for item in inline:
        # Three bytes per four base64 characters: a string far too long is refused before it is decoded.
        kind = _check_declared(policy, item.content_type, len(item.data) * 3 // 4 - 2)
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            raise refuse("FILE_DATA_INVALID") from None
        if len(data) > policy.max_file_bytes:
            raise refuse("FILE_TOO_LARGE", 413)
        inline_total += len(data)
        if inline_total > policy.max_inline_bytes:
            raise refuse("FILES_TOO_LARGE", 413)
        _check_content(data, kind, len(data))
        decoded.append((item, kind, data))
    for file_id in file_ids:
        record = await store.describe(file_id) if is_file_id(file_id) else None
        if record is None or not record.usable_by(caller, session_id):
            raise refuse("FILE_NOT_FOUND", 404)
        _check_declared(policy, record.content_type, record.size)
        stored = await store.read(file_id, policy.max_file_bytes)
        if stored is None:
            raise refuse("FILE_NOT_FOUND", 404)
        if len(stored) > policy.max_file_bytes:
            raise refuse("FILE_TOO_LARGE", 413)
        _check_content(stored, record.content_type, record.size)
        total += len(stored)
        if total > policy.max_turn_bytes:
            raise refuse("FILES_TOO_LARGE", 413)
        taken.refs.append(FileRef(id=file_id, name=record.name, content_type=record.content_type,
                                  size=len(stored), digest=digest_of(stored)))
        taken.data[file_id] = stored
    if total + inline_total > policy.max_turn_bytes:
        raise refuse("FILES_TOO_LARGE", 413)
    for item, kind, data in decoded:
        record = FileRecord(
            id=new_file_id(), name=safe_name(item.name), content_type=kind, size=len(data),
            owner=owner_tag(caller), session=session_id or "", expires_at=int(time.time()) + policy.use_seconds,
        )
        taken.inline.append(record)
        taken.refs.append(FileRef(id=record.id, name=record.name, content_type=kind, size=len(data),
                                  digest=digest_of(data)))
        taken.data[record.id] = data
    return taken


async def store_inline(store: FileStore | None, records: Sequence[FileRecord], data: Mapping[str, bytes]) -> None:
    """Store the inline files ``take_files`` checked (their bytes in ``data``), together, within the turn's time.

    Called once a turn has passed every check of the request and its session, so a refused request or a
    replayed one stores nothing.
    """
    if store is None or any(record.id not in data for record in records):
        raise FileStoreError("Inline files need a file store and their bytes.")
    try:
        await asyncio.wait_for(
            asyncio.gather(*(store.put(record, data[record.id]) for record in records)), time_left("storing files")
        )
    except TimeoutError:
        raise FileStoreError("Storing the inline files ran out of the turn's time.") from None
