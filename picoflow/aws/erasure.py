"""Erasing one principal's data: its sessions (receipts included), effect-journal entries, uploaded files and the
record of its open WebSocket connection.

``DELETE /ai/me`` erases the caller's own data and ``picoflow erase --owner SUB`` anyone's; both call
``erase_owner``. Files go first: an erasure that fails half-way is simply run again, and finds what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from picoflow.aws.observability import logger
from picoflow.aws.ws_connections import ConnectionBook
from picoflow.files.store import FileStore, owner_tag
from picoflow.session.store import SessionStore


@dataclass(frozen=True)
class Erasure:
    """What one erasure removed."""

    sessions: int
    files: int


async def erase_owner(session_store: SessionStore, file_store: FileStore | None, owner: str) -> Erasure:
    """Remove everything stored for the principal ``owner`` (a blank one is refused with ``ValueError``)."""
    if not owner:
        raise ValueError("An erasure needs a principal; anonymous sessions belong to nobody.")
    files = await file_store.delete_owner(owner) if file_store is not None else 0
    sessions = await session_store.delete_owner(owner)
    book = ConnectionBook.of(session_store)
    if book is not None:
        await book.erase(owner)
    # The log names the principal by the digest files record, never by the claim itself.
    logger.info("Principal erased", extra={"ownerTag": owner_tag(owner), "sessions": sessions, "files": files})
    return Erasure(sessions=sessions, files=files)


class ErasedEnvelope(BaseModel):
    """The answer of ``DELETE /ai/me``."""

    success: bool
    sessions: int = Field(description="Sessions removed, with their receipts and journal entries.")
    files: int = Field(description="Uploaded files removed.")
