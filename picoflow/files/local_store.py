"""A file store in a local folder, for ``picoflow serve`` and tests; its upload URLs are served by ``picoflow serve``.

Each file is ``<id>.bin`` with its record in ``<id>.json``; ids are generated and checked against
``FILE_ID_PATTERN`` before any path is built. Upload URLs are signed with a key kept in the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from picoflow.errors import FileStoreError
from picoflow.files.refs import is_file_id
from picoflow.files.store import FileRecord, FileStore, UploadTicket, owner_tag

#: Where ``picoflow serve`` accepts uploads: ``PUT /ai/uploads/<fileId>?expires=...&signature=...``.
UPLOAD_PATH = "/ai/uploads/"
_KEY_FILE = ".upload-key"


class LocalFileStore(FileStore):
    """Files in ``folder``; upload URLs are relative to the server (``/ai/uploads/<id>?...``)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._key = self._signing_key()

    def _signing_key(self) -> bytes:
        path = self.folder / _KEY_FILE
        # Several processes may share the folder (the demo, then picoflow serve): the first one writes the key.
        with contextlib.suppress(FileExistsError):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(secrets.token_bytes(32))
        return path.read_bytes()

    def _path(self, file_id: str, suffix: str) -> Path:
        if not is_file_id(file_id):
            raise ValueError("not a file id")
        return self.folder / f"{file_id}{suffix}"

    def _signature(self, file_id: str, content_type: str, size: int, expires: int) -> str:
        message = f"{file_id}\n{content_type}\n{size}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    async def presign_upload(self, record: FileRecord, expires_in: int) -> UploadTicket:
        expires = int(time.time()) + expires_in
        description = record.model_dump_json(by_alias=True)
        await asyncio.to_thread(self._write, self._path(record.id, ".json"), description)
        signature = self._signature(record.id, record.content_type, record.size, expires)
        return UploadTicket(
            file_id=record.id,
            upload_url=f"{UPLOAD_PATH}{record.id}?expires={expires}&signature={signature}",
            upload_headers={"Content-Type": record.content_type},
            expires_in=expires_in,
        )

    def accept_upload(self, file_id: str, query: Mapping[str, str], content_type: str, body: bytes) -> int:
        """Store an upload sent to its signed URL; the HTTP status to answer (200, 403 or 404)."""
        if not is_file_id(file_id):
            return 404
        record = self._record(file_id)
        try:
            expires = int(query.get("expires", ""))
        except ValueError:
            return 403
        if record is None:
            return 404
        expected = self._signature(file_id, record.content_type, record.size, expires)
        # The signature covers the declared type and size: an upload must match both, before its URL expires.
        if (
            not hmac.compare_digest(expected, query.get("signature", ""))
            or time.time() > expires
            or content_type.split(";")[0].strip().lower() != record.content_type
            or len(body) != record.size
        ):
            return 403
        self._write(self._path(file_id, ".bin"), body)
        return 200

    def _record(self, file_id: str) -> FileRecord | None:
        try:
            return FileRecord.model_validate_json(self._path(file_id, ".json").read_bytes())
        except (OSError, ValueError):
            return None

    def _describe(self, file_id: str) -> FileRecord | None:
        record = self._record(file_id)
        return record if record is not None and self._path(file_id, ".bin").is_file() else None

    async def describe(self, file_id: str) -> FileRecord | None:
        return await asyncio.to_thread(lambda: self._describe(file_id)) if is_file_id(file_id) else None

    def _read(self, file_id: str, limit: int) -> bytes | None:
        try:
            with self._path(file_id, ".bin").open("rb") as handle:
                # Sized to the file: a read of limit + 1 bytes would set aside that much memory first.
                return handle.read(min(limit, os.fstat(handle.fileno()).st_size) + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FileStoreError(f"Local file store read failed: {type(exc).__name__}") from exc

    async def read(self, file_id: str, limit: int) -> bytes | None:
        return await asyncio.to_thread(lambda: self._read(file_id, limit)) if is_file_id(file_id) else None

    async def put(self, record: FileRecord, data: bytes) -> None:
        def write() -> None:
            self._write(self._path(record.id, ".json"), record.model_dump_json(by_alias=True))
            self._write(self._path(record.id, ".bin"), data)

        await asyncio.to_thread(write)

    async def delete_owner(self, owner: str) -> int:
        if not owner:
            raise ValueError("delete_owner needs a principal; anonymous uploads belong to nobody.")
        tag = owner_tag(owner)

        def remove() -> int:
            removed = 0
            for described in self.folder.glob("f_*.json"):
                file_id = described.name.removesuffix(".json")
                record = self._record(file_id) if is_file_id(file_id) else None
                if record is None or record.owner != tag:
                    continue
                self._path(file_id, ".bin").unlink(missing_ok=True)
                described.unlink(missing_ok=True)
                removed += 1
            return removed

        return await asyncio.to_thread(remove)

    @staticmethod
    def _write(path: Path, data: str | bytes) -> None:
        # Written aside and renamed, so a reader never sees half a file.
        temporary = path.with_name(path.name + ".part")
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(temporary, path)


def store_upload_target(path: str) -> str | None:
    """The file id an upload path (``/ai/uploads/<id>``) names, or None when it is not one."""
    if not path.startswith(UPLOAD_PATH):
        return None
    candidate = path[len(UPLOAD_PATH):]
    return candidate if is_file_id(candidate) else None
