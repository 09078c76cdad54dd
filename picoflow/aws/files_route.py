"""``POST /ai/files`` and the files of ``POST /ai/run`` on the Lambda runtime: opening an upload, taking a turn's
files, and the answer both give when the file store is off, refuses a file or fails."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.metrics import MetricUnit

from picoflow.aws.deadline import InvocationContext, wait_limit
from picoflow.aws.observability import logger, metrics
from picoflow.aws.requests import FileUploadRequest, RunRequest
from picoflow.aws.responses import echoable, envelope, failure, unavailable
from picoflow.aws.runtime import get_runtime
from picoflow.errors import FileRefusedError, FileStoreError
from picoflow.files.intake import TakenFiles, open_upload, take_files
from picoflow.files.policy import FilePolicy
from picoflow.files.store import FileStore

T = TypeVar("T")


def open_file_upload(
    request: FileUploadRequest, session_id: str | None, caller: str | None, request_id: str,
    context: InvocationContext | None,
) -> Response[str]:
    """The upload ticket of ``POST /ai/files``, or the failure answer."""
    ticket = _with_file_store(
        lambda store, policy: open_upload(store, policy, name=request.name, content_type=request.content_type,
                                          size=request.size, caller=caller, session_id=session_id),
        session_id, request_id, context,
    )
    if isinstance(ticket, Response):
        return ticket
    metrics.add_metric(name="UploadsOpened", unit=MetricUnit.Count, value=1)
    return envelope(200, ticket.model_dump(by_alias=True), echoable(session_id))


def take_turn_files(
    request: RunRequest, session_id: str | None, caller: str | None, request_id: str,
    context: InvocationContext | None,
) -> TakenFiles | Response[str]:
    """The turn's files, checked (the engine stores inline ones once the turn may run); or the failure answer."""
    return _with_file_store(
        lambda store, policy: take_files(store, policy, file_ids=request.file_ids(), inline=request.inline_files(),
                                         caller=caller, session_id=session_id),
        session_id, request_id, context,
    )


def _with_file_store(
    start: Callable[[FileStore, FilePolicy], Coroutine[Any, Any, T]], session_id: str | None, request_id: str,
    context: InvocationContext | None,
) -> T | Response[str]:
    """What ``start`` gives on the runtime's file store within the invocation's time, or the failure answer."""
    runtime = get_runtime()
    store = runtime.engine.file_store
    if store is None:
        logger.info("Request refused", extra={"code": "FILES_DISABLED", "statusCode": 400})
        return failure(400, "FILES_DISABLED", session_id or "", request_id)
    try:
        return runtime.call(start(store, runtime.file_policy), timeout=wait_limit(context))
    except (FileRefusedError, FileStoreError, TimeoutError) as error:
        return _file_failure(error, session_id, request_id)


def _file_failure(error: Exception, session_id: str | None, request_id: str) -> Response[str]:
    if isinstance(error, FileRefusedError):
        logger.info("Files refused", extra={"code": error.code, "statusCode": error.status_code})
        return failure(error.status_code, error.code, session_id or "", request_id)
    logger.error("File store failed", extra={"errorType": type(error).__name__})
    return unavailable("FILE_STORE_ERROR", session_id or "", request_id)
