"""Build API Gateway HTTP API (payload format 2.0) events and a stand-in Lambda context.

Used by ``picoflow serve``, the offline demo and the tests to drive the real Lambda handler
exactly as API Gateway would, without AWS.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aws_lambda_powertools.utilities.typing import LambdaContext

from picoflow.wire import JSON

ACCOUNT_ID = "123456789012"
API_ID = "local"
REGION = "us-east-1"

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "+json", "+xml")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

HeaderInput = Mapping[str, str] | Iterable[tuple[str, str]]
QueryInput = str | Mapping[str, str | Sequence[str]]


def http_event(
    method: str,
    path: str,
    *,
    body: str | bytes | Mapping[str, Any] | list[Any] | None = None,
    headers: HeaderInput | None = None,
    query: QueryInput | None = None,
    source_ip: str = "127.0.0.1",
    request_id: str | None = None,
) -> dict[str, Any]:
    """Return the event API Gateway would deliver to a Lambda proxy integration for this request.

    ``body`` may be text, raw bytes (base64-encoded unless the content type is textual and the bytes
    are UTF-8) or a JSON-serialisable dict/list (sent as ``application/json``). ``headers`` may be a
    mapping or a sequence of pairs; names are lower-cased, repeated headers are joined with commas and
    ``Cookie`` headers move to ``cookies``. ``query`` is a raw query string or a mapping whose values
    may be lists.
    """
    method = method.upper()
    merged = _merge_headers(headers or {})
    cookies = _split_cookies(merged.pop("cookie", None))

    if isinstance(body, Mapping | list):
        body = json.dumps(body, separators=(",", ":"))
        merged.setdefault("content-type", JSON)
    is_base64 = False
    encoded_body: str | None = None
    if isinstance(body, bytes):
        encoded_body, is_base64 = _encode_bytes(body, merged.get("content-type", ""))
        merged.setdefault("content-length", str(len(body)))
    elif body is not None:
        encoded_body = body
        merged.setdefault("content-length", str(len(body.encode("utf-8"))))

    raw_query, query_params = _query(query)
    host = merged.setdefault("host", f"{API_ID}.execute-api.{REGION}.amazonaws.com")
    merged.setdefault("x-forwarded-for", source_ip)
    merged.setdefault("x-forwarded-proto", "https")
    merged.setdefault("x-forwarded-port", "443")
    now = datetime.now(UTC)
    request_id = request_id or _request_id()
    route_key = f"{method} {path}"

    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": raw_query,
        "headers": merged,
        "requestContext": {
            "accountId": ACCOUNT_ID,
            "apiId": API_ID,
            "domainName": host,
            "domainPrefix": host.split(".", 1)[0],
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": merged.get("user-agent", ""),
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": f"{now:%d}/{_MONTHS[now.month - 1]}/{now:%Y:%H:%M:%S} +0000",
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "isBase64Encoded": is_base64,
    }
    if cookies:
        event["cookies"] = cookies
    if query_params:
        event["queryStringParameters"] = query_params
    if encoded_body is not None:
        event["body"] = encoded_body
    return event


@dataclass
class FakeLambdaContext(LambdaContext):
    """A Lambda context for invoking a handler outside Lambda: a Powertools ``LambdaContext`` whose fields are set
    here (Powertools' ``Logger.inject_lambda_context`` and the handler read them as in Lambda).

    ``get_remaining_time_in_millis()`` counts down from ``timeout_ms`` at construction, never below zero.
    """

    function_name: str = "picoflow-api"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 1024
    timeout_ms: int = 25_000
    # A plain default (filled in below): a default factory would leave Powertools' read-only property in place.
    aws_request_id: str = ""
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""
    tenant_id: str | None = None
    identity: Any = None
    client_context: Any = None
    # An instance attribute, not a method: Powertools declares this a staticmethod, which cannot see the deadline.
    get_remaining_time_in_millis: Callable[[], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.aws_request_id:
            self.aws_request_id = str(uuid.uuid4())
        if not self.invoked_function_arn:
            self.invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{self.function_name}"
        if not self.log_group_name:
            self.log_group_name = f"/aws/lambda/{self.function_name}"
        if not self.log_stream_name:
            self.log_stream_name = f"{datetime.now(UTC):%Y/%m/%d}/[{self.function_version}]{uuid.uuid4().hex}"
        deadline = time.monotonic() + self.timeout_ms / 1000
        self.get_remaining_time_in_millis = lambda: max(0, int((deadline - time.monotonic()) * 1000))


def _merge_headers(headers: HeaderInput) -> dict[str, str]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    merged: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key == "cookie" and key in merged:
            merged[key] = f"{merged[key]}; {value}"
        elif key in merged:
            merged[key] = f"{merged[key]},{value}"
        else:
            merged[key] = value
    return merged


def _split_cookies(header: str | None) -> list[str]:
    if not header:
        return []
    return [part.strip() for part in header.split(";") if part.strip()]


def _encode_bytes(raw: bytes, content_type: str) -> tuple[str, bool]:
    if any(marker in content_type.lower() for marker in _TEXT_TYPES):
        try:
            return raw.decode("utf-8"), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(raw).decode("ascii"), True


def _query(query: QueryInput | None) -> tuple[str, dict[str, str]]:
    if query is None:
        return "", {}
    if isinstance(query, str):
        raw = query.lstrip("?")
        pairs = parse_qsl(raw, keep_blank_values=True)
    else:
        pairs = [
            (key, item)
            for key, value in query.items()
            for item in ([value] if isinstance(value, str) else value)
        ]
        raw = urlencode(pairs)
    params: dict[str, str] = {}
    for key, value in pairs:
        # API Gateway v2 folds repeated parameters into one comma-separated value.
        params[key] = f"{params[key]},{value}" if key in params else value
    return raw, params


def _request_id() -> str:
    # Shaped like API Gateway's own ids, e.g. "JKJaXmPLvHcESHA=".
    return base64.b64encode(uuid.uuid4().bytes[:10]).decode("ascii")
