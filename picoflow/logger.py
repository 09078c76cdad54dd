"""Logging: the library's operational log, and SessionLogger for entries kept inside the session document."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from picoflow.session.document import LogEntry, SessionDoc, format_timestamp

LIBRARY_LOGGER_NAME = "picoflow"
#: The library's own log lines (codes, timings, never conversation text): a standard ``logging`` logger,
#: which an adapter formats (``picoflow.aws`` gives it the Lambda function's JSON format and keys).
library_log = logging.getLogger(LIBRARY_LOGGER_NAME)


class SessionLogger:
    """Appends ``{timestamp, level, message, ...extra}`` entries to one of the document's log arrays."""

    def __init__(self, doc: SessionDoc) -> None:
        self._doc = doc

    def _append(self, level: str, message: str, extra: dict[str, Any]) -> None:
        entry = LogEntry(timestamp=format_timestamp(datetime.now(UTC)), level=level, message=message, **extra)
        getattr(self._doc, level).append(entry)

    def log(self, message: str, **extra: Any) -> None:
        self._append("log", message, extra)

    def error(self, message: str, **extra: Any) -> None:
        self._append("error", message, extra)

    def warn(self, message: str, **extra: Any) -> None:
        self._append("warn", message, extra)

    def debug(self, message: str, **extra: Any) -> None:
        self._append("debug", message, extra)

    def verbose(self, message: str, **extra: Any) -> None:
        self._append("verbose", message, extra)
