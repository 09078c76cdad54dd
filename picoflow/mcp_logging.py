"""The ``mcp`` SDK's own log records, kept to PicoFlow's rules: no tool output, no server output, no arguments.

The SDK logs what it failed to parse (a server's stdout line, a response body) with its text and a traceback. Once
a server is first used, the ``mcp`` logger stops passing its records on; each WARNING or worse becomes one
``MCP SDK reported a problem`` record on PicoFlow's logger with the SDK logger's name and the exception's type
only. Anything below WARNING is dropped. An operator who wants the SDK's own records back (while debugging a
server they trust) sets ``logging.getLogger("mcp").propagate = True`` after the first connection.
"""

from __future__ import annotations

import logging

from picoflow.logger import library_log

SDK_LOGGER = "mcp"


class SdkRecordRelay(logging.Handler):
    """Re-emits an SDK record as a fixed sentence with its logger's name and exception type (never its text)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        library_log.log(record.levelno, "MCP SDK reported a problem",
                        extra={"sdkLogger": record.name, "errorType": error})


def quiet_sdk_logs() -> None:
    """Route the ``mcp`` logger's records through :class:`SdkRecordRelay` only (idempotent)."""
    logger = logging.getLogger(SDK_LOGGER)
    if any(isinstance(handler, SdkRecordRelay) for handler in logger.handlers):
        return
    logger.addHandler(SdkRecordRelay())
    logger.propagate = False
