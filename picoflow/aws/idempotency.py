"""The ``Idempotency-Key`` header: what a key may be, and the headers of a replayed answer.

A turn with a key is applied at most once: the engine records the key (scoped by the caller) in the
same conditional write as the session, and a retry with the same key and body gets the original status
and body back, marked ``Idempotent-Replayed: true``, without running again.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Header
from pydantic import StringConstraints

from picoflow import RunResponse
from picoflow.aws.requests import NoHeader
from picoflow.wire import IDEMPOTENCY_HEADER, REPLAYED_HEADER, RETRY_AFTER_HEADER

MAX_IDEMPOTENCY_KEY_CHARS = 256

#: A key of 1-256 printable ASCII characters (surrounding whitespace is ignored).
IdempotencyKey = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=f"^[ -~]{{1,{MAX_IDEMPOTENCY_KEY_CHARS}}}$")
]
#: The optional ``Idempotency-Key`` header holding one.
IdempotencyKeyHeader = Annotated[
    IdempotencyKey | NoHeader,
    Header(
        alias=IDEMPOTENCY_HEADER,
        description="Makes a retried turn return the original response instead of running again.",
    ),
]


def retry_headers(result: RunResponse) -> dict[str, str]:
    """The headers telling a client that ``result`` is a replay, or when to retry it."""
    headers: dict[str, str] = {}
    if result.replayed:
        headers[REPLAYED_HEADER] = "true"
    if result.retry_after is not None:
        headers[RETRY_AFTER_HEADER] = str(result.retry_after)
    return headers
