"""What a session document stores for a file: a reference (id, name, type, size, digest), never the bytes.

A message holding files has list content: text parts and one ``{"type": "file_ref", ...}`` part per file.
Only when a model is called does a reference become that provider's own content part.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: The ``type`` of a message content part that references a stored file.
FILE_PART_TYPE = "file_ref"
FILE_ID_PATTERN = re.compile(r"^f_[A-Za-z0-9_-]{32}$")
PNG, JPEG, WEBP, GIF, PDF = "image/png", "image/jpeg", "image/webp", "image/gif", "application/pdf"
IMAGE_TYPES = frozenset({PNG, JPEG, WEBP, GIF})
#: Every type whose content can be checked; the allow-list is a subset of these.
KNOWN_TYPES = frozenset({*IMAGE_TYPES, PDF})
#: The most UTF-8 bytes a display name keeps: a file system's usual name limit. Percent-encoded (at most three
#: bytes per byte) it stays well inside S3's 2 KB of user metadata beside a file record's other fields.
MAX_NAME_BYTES = 255
_KEPT_SUFFIX_BYTES = 16


class FileRef(BaseModel):
    """A stored file as a message references it."""

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    id: str = Field(pattern=FILE_ID_PATTERN.pattern)
    name: str
    content_type: str = Field(alias="contentType")
    size: int = Field(ge=0)
    #: ``sha256:<hex>`` of the bytes: a file replaced behind the reference is never sent as this one.
    digest: str


def new_file_id() -> str:
    """A fresh, unguessable file id (the only name a stored file ever has)."""
    return "f_" + secrets.token_urlsafe(24)


def is_file_id(value: Any) -> bool:
    """Whether ``value`` has the shape of a file id (anything else is never looked up)."""
    return isinstance(value, str) and FILE_ID_PATTERN.fullmatch(value) is not None


def digest_of(data: bytes) -> str:
    """The digest a ``FileRef`` records for ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_part(ref: FileRef) -> dict[str, Any]:
    """The content part that references ``ref`` in a message."""
    return {"type": FILE_PART_TYPE, **ref.model_dump(by_alias=True)}


def is_file_part(part: Any) -> bool:
    """Whether a content part references a stored file."""
    return isinstance(part, Mapping) and part.get("type") == FILE_PART_TYPE


def part_ref(part: Mapping[str, Any]) -> FileRef | None:
    """The reference a file part holds; None when the part is malformed."""
    try:
        return FileRef.model_validate({key: value for key, value in part.items() if key != "type"})
    except ValidationError:
        return None


def file_refs(content: Any) -> list[FileRef]:
    """The files a message's content references, in order."""
    if not isinstance(content, list):
        return []
    refs = [part_ref(part) for part in content if is_file_part(part)]
    return [ref for ref in refs if ref is not None]


def with_files(text: str | None, refs: Iterable[FileRef]) -> list[dict[str, Any]]:
    """Message content holding ``text`` (when there is any) and a part for each file of ``refs``."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.extend(file_part(ref) for ref in refs)
    return parts


_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", PNG),
    (b"\xff\xd8\xff", JPEG),
    (b"GIF87a", GIF),
    (b"GIF89a", GIF),
    (b"%PDF-", PDF),
)


def sniff_type(data: bytes) -> str | None:
    """The type the first bytes of ``data`` show (one of ``KNOWN_TYPES``), or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    return next((kind for magic, kind in _SIGNATURES if data.startswith(magic)), None)


def cut_utf8(text: str, limit: int) -> str:
    """The longest start of ``text`` whose UTF-8 encoding takes at most ``limit`` bytes (whole characters only)."""
    # Decoding a cut that splits a character drops the partial character's bytes.
    return text.encode("utf-8")[: max(limit, 0)].decode("utf-8", "ignore")


def safe_name(name: str) -> str:
    """A display name: the last path segment, without control characters, cut to ``MAX_NAME_BYTES`` UTF-8 bytes.

    It is shown to the model and the user only; no file is ever stored or opened under it.
    """
    last = re.split(r"[\\/]", name)[-1]
    cleaned = "".join(ch for ch in last if unicodedata.category(ch)[0] != "C").strip()
    stem, dot, suffix = cleaned.rpartition(".")
    if len(cleaned.encode("utf-8")) > MAX_NAME_BYTES and stem and len(suffix.encode("utf-8")) <= _KEPT_SUFFIX_BYTES:
        # A cut name keeps its suffix, so it still says what kind of file it is.
        return cut_utf8(stem, MAX_NAME_BYTES - len((dot + suffix).encode("utf-8"))).strip() + dot + suffix
    return cut_utf8(cleaned, MAX_NAME_BYTES).strip() or "file"


def allowed_types(value: str | Sequence[str] | None) -> frozenset[str]:
    """The allow-list from a comma-separated string or a list; types outside ``KNOWN_TYPES`` are an error."""
    if value is None or value == "":
        return KNOWN_TYPES
    items = value.split(",") if isinstance(value, str) else list(value)
    types = frozenset(item.strip().lower() for item in items if item.strip())
    unknown = sorted(types - KNOWN_TYPES)
    if unknown:
        raise ValueError(f"File types {unknown} cannot be checked; allow some of {sorted(KNOWN_TYPES)}.")
    return types
