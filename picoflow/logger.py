"""SessionLogger: structured diagnostic entries kept inside the session document."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from picoflow.session.document import LogEntry, SessionDoc, format_timestamp


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
