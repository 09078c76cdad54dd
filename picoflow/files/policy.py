"""The limits every file must meet before anything is stored, read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from picoflow.files.refs import KNOWN_TYPES, allowed_types

MIB = 1024 * 1024
#: The file bytes one model request carries in full unless configured otherwise: a turn's own files always fit.
DEFAULT_REQUEST_FILE_BYTES = 10 * MIB


class FilePolicy(BaseModel):
    """Allowed types and size and count limits of files, per file and per turn.

    Inline files travel base64-encoded inside the request, whose API Gateway and Lambda payload limits
    (10 MB, 6 MB) they must fit with room to spare: ``max_inline_bytes`` bounds their decoded total.
    """

    model_config = ConfigDict(frozen=True)

    allowed_types: frozenset[str] = KNOWN_TYPES
    max_file_bytes: int = Field(default=5 * MIB, gt=0)
    max_files: int = Field(default=4, ge=0)
    max_turn_bytes: int = Field(default=10 * MIB, gt=0)
    max_inline_bytes: int = Field(default=3 * MIB, ge=0)
    #: The file bytes one model request carries in full; files beyond it go as references the model can open.
    max_request_bytes: int = Field(default=DEFAULT_REQUEST_FILE_BYTES, gt=0)
    #: Seconds an upload URL stays valid.
    upload_seconds: int = Field(default=900, gt=0)
    #: Seconds after its upload URL was issued during which a file may be attached to a turn.
    use_seconds: int = Field(default=86_400, gt=0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FilePolicy:
        """The policy from ``PICOFLOW_FILE_TYPES`` (comma-separated), ``PICOFLOW_MAX_FILE_BYTES``,
        ``PICOFLOW_MAX_FILES_PER_TURN``, ``PICOFLOW_MAX_TURN_FILE_BYTES``, ``PICOFLOW_MAX_INLINE_FILE_BYTES``,
        ``PICOFLOW_MAX_REQUEST_FILE_BYTES``, ``PICOFLOW_UPLOAD_URL_SECONDS`` and ``PICOFLOW_FILE_USE_SECONDS``;
        unset ones keep their defaults."""
        env = os.environ if environ is None else environ
        names = {
            "max_file_bytes": "PICOFLOW_MAX_FILE_BYTES",
            "max_files": "PICOFLOW_MAX_FILES_PER_TURN",
            "max_turn_bytes": "PICOFLOW_MAX_TURN_FILE_BYTES",
            "max_inline_bytes": "PICOFLOW_MAX_INLINE_FILE_BYTES",
            "max_request_bytes": "PICOFLOW_MAX_REQUEST_FILE_BYTES",
            "upload_seconds": "PICOFLOW_UPLOAD_URL_SECONDS",
            "use_seconds": "PICOFLOW_FILE_USE_SECONDS",
        }
        values: dict[str, int] = {field: int(env[name]) for field, name in names.items() if env.get(name)}
        return cls(allowed_types=allowed_types(env.get("PICOFLOW_FILE_TYPES")), **values)
