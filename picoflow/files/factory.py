"""The file store the environment names: ``FILES_BUCKET`` (S3) or ``FILES_FOLDER`` (a local folder)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from picoflow.files.store import FileStore


def file_store_from_env(environ: Mapping[str, str] | None = None) -> FileStore | None:
    """An ``S3FileStore`` for ``FILES_BUCKET`` (``S3_ENDPOINT_URL`` overrides the endpoint), else a
    ``LocalFileStore`` in ``FILES_FOLDER``; None when neither is set (the API then accepts no files)."""
    env = os.environ if environ is None else environ
    bucket = (env.get("FILES_BUCKET") or "").strip()
    if bucket:
        from picoflow.files.s3_store import S3FileStore

        return S3FileStore(bucket, endpoint_url=env.get("S3_ENDPOINT_URL") or None)
    folder = (env.get("FILES_FOLDER") or "").strip()
    if folder:
        from picoflow.files.local_store import LocalFileStore

        return LocalFileStore(folder)
    return None
