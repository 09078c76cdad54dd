"""Files the server holds itself, such as a sample a flow ships with: read by flow code, checked like an upload.

Only flow code names such a file (a path it chose, typically from an allow-list); a model's or a client's
words never become a path here.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from picoflow.errors import PicoFlowError
from picoflow.files.policy import FilePolicy
from picoflow.files.refs import FileRef, digest_of, safe_name, sniff_type


def held_file_id(digest: str) -> str:
    """The file id of held bytes with ``digest``: the same content always has the same id."""
    tag = hashlib.sha256(b"picoflow-held-file\0" + digest.encode("ascii")).digest()
    return "f_" + base64.urlsafe_b64encode(tag).decode("ascii")[:32]


def read_held_file(path: Path, name: str | None = None, policy: FilePolicy | None = None) -> tuple[FileRef, bytes]:
    """The reference and bytes of the file at ``path``, shown to the model as ``name`` (default: its file name).

    Raises ``PicoFlowError`` when the file is missing, larger than the policy's per-file limit, or not of an
    allowed type by its content: a defect of the flow that names it.
    """
    limits = policy or FilePolicy.from_env()
    try:
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise PicoFlowError(f"Server file '{path.name}' is larger than {limits.max_file_bytes} bytes.")
        data = path.read_bytes()
    except OSError as exc:
        raise PicoFlowError(f"Server file '{path.name}' cannot be read.") from exc
    kind = sniff_type(data)
    if kind is None or kind not in limits.allowed_types:
        raise PicoFlowError(f"Server file '{path.name}' is not of an allowed file type.")
    digest = digest_of(data)
    ref = FileRef(id=held_file_id(digest), name=safe_name(name or path.name), content_type=kind, size=len(data),
                  digest=digest)
    return ref, data
