"""Where file bytes live: the ``FileStore`` interface, and what it keeps beside each file."""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict, Field

from picoflow.errors import FileStoreError
from picoflow.files.refs import FILE_ID_PATTERN


def owner_tag(caller: str | None) -> str:
    """What a file records of the principal that uploaded it: a digest (never the claim), "" when anonymous."""
    if not caller:
        return ""
    return hashlib.sha256(b"picoflow-file-owner\0" + caller.encode("utf-8")).hexdigest()[:32]


class FileRecord(BaseModel):
    """A stored file's metadata: its id, display name, declared type and size, owner, session and expiry."""

    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(pattern=FILE_ID_PATTERN.pattern)
    name: str
    content_type: str = Field(alias="contentType")
    size: int = Field(ge=0)
    #: ``owner_tag`` of the uploading principal; "" for an anonymous upload (usable by anyone holding the id).
    owner: str = ""
    #: The session the file was uploaded for; "" when it may start a session.
    session: str = ""
    #: Epoch seconds after which the file can no longer be attached to a turn.
    expires_at: int = Field(alias="expiresAt")

    def usable_by(self, caller: str | None, session_id: str | None, now: float | None = None) -> bool:
        """Whether ``caller`` may attach this file to a turn of ``session_id`` (None: a new session)."""
        if self.owner != owner_tag(caller) or (self.session and self.session != session_id):
            return False
        return (time.time() if now is None else now) < self.expires_at


class UploadTicket(BaseModel):
    """The answer of ``POST /ai/files``: where and how to send the file's bytes."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    file_id: str = Field(alias="fileId")
    upload_url: str = Field(alias="uploadUrl", description="PUT the bytes here, with exactly uploadHeaders.")
    upload_headers: dict[str, str] = Field(alias="uploadHeaders")
    expires_in: int = Field(alias="expiresIn", description="Seconds the upload URL stays valid.")


class FileStore(ABC):
    """Keeps file bytes and their records under generated ids; no path ever comes from a caller.

    ``describe`` and ``read`` answer None for a file that is not (or no longer) there; failures of the
    backend raise ``FileStoreError``.
    """

    @abstractmethod
    async def presign_upload(self, record: FileRecord, expires_in: int) -> UploadTicket:
        """A URL (and headers) through which a client uploads exactly the bytes ``record`` declares."""

    @abstractmethod
    async def describe(self, file_id: str) -> FileRecord | None:
        """The record of an uploaded file (its declared size); None when no bytes were stored."""

    @abstractmethod
    async def read(self, file_id: str, limit: int) -> bytes | None:
        """At most ``limit + 1`` bytes of the file (so an oversized one shows), or None when it is gone."""

    @abstractmethod
    async def put(self, record: FileRecord, data: bytes) -> None:
        """Store ``data`` under ``record`` (inline files, which arrive with the request)."""

    async def delete_owner(self, owner: str) -> int:
        """Delete every file the principal ``owner`` uploaded (bytes and record); return how many went.

        Anonymous uploads are never touched and a blank ``owner`` is refused with ``ValueError``. Stores that
        cannot find a principal's files raise ``FileStoreError``."""
        raise FileStoreError(f"{type(self).__name__} cannot erase a principal's files.")
