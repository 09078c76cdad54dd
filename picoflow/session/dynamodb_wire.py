"""The session store's requests in DynamoDB's JSON protocol, signed and sent without botocore's per-call machinery.

A botocore client call walks the service model, a dozen event hooks, the endpoint rules and a case-insensitive
header map for every request; for the store's three fixed operations that is most of a turn's storage CPU.
``DynamoDBWire`` sends the same requests from a botocore client's endpoint, region and credentials: SigV4
signed, on kept-alive connections, with botocore's standard retry policy (attempts, jittered backoff, the
``x-amz-retry-after`` hint, DynamoDB's CRC32 check) and botocore's exception types, so callers handle failures
the same way. Each request is still offered to the client's ``before-send`` hooks first, where botocore-level
mocks answer requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import random
import select
import socket
import ssl
import threading
import time
import zlib
from typing import Any
from urllib.parse import urlsplit

from botocore.awsrequest import AWSPreparedRequest
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.httpsession import get_cert_path

OPERATIONS = frozenset({"GetItem", "PutItem", "DeleteItem"})
SERVICE = "dynamodb"
TARGET_PREFIX = "DynamoDB_20120810."
CONTENT_TYPE = "application/x-amz-json-1.0"
ALGORITHM = "AWS4-HMAC-SHA256"

# botocore's standard retry mode: these codes are throttling (backoff base 1 s) or transient (25 ms for DynamoDB).
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
    }
)
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"})
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
THROTTLING_BACKOFF_SECONDS = 1.0
TRANSIENT_BACKOFF_SECONDS = 0.025
MAX_BACKOFF_SECONDS = 20.0
MAX_RETRY_AFTER_EXTRA_SECONDS = 5.0
MAX_LINE_BYTES = 65536
MAX_HEADERS = 100


class UnreadableAnswerError(BotoCoreError):
    """A successful answer whose body is not DynamoDB's JSON (what botocore's parser would refuse)."""

    fmt = "Unreadable DynamoDB answer: {reason}"


class DynamoDBWire:
    """Sends GetItem, PutItem and DeleteItem for one DynamoDB endpoint; thread-safe.

    ``call`` takes and returns the same dictionaries as the botocore client's methods (binary values as
    ``bytes``) and raises what botocore raises: ``ClientError`` for an error answer, ``ConnectionError``
    subclasses when no connection could be made, ``HTTPClientError`` subclasses when a sent request got no
    answer, ``NoCredentialsError`` without credentials.
    """

    def __init__(
        self,
        client: Any,
        credentials: Any,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        ca_bundle: str | None = None,
    ) -> None:
        self.endpoint_url: str = client.meta.endpoint_url
        self.region: str = client.meta.region_name
        self._events = client.meta.events
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_attempts = max_attempts
        parts = urlsplit(self.endpoint_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._netloc = parts.netloc
        self._path = parts.path or "/"
        self._url = f"{parts.scheme}://{parts.netloc}{self._path}"
        self._ca_bundle = ca_bundle
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._signing_keys: dict[tuple[str, str], bytes] = {}

    def call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        """Send ``operation`` with ``request`` (botocore's parameter names), retrying as botocore's standard mode."""
        if operation not in OPERATIONS:
            raise ValueError(f"DynamoDBWire sends {sorted(OPERATIONS)}, not {operation!r}")
        body = json.dumps(request, separators=(",", ":"), default=_base64).encode("utf-8")
        attempt = 1
        while True:
            status, headers, data, error = self._attempt(operation, body)
            if error is None and status < 300 and _crc_matches(headers, data):
                return _decode(_answer(data))
            if error is None:
                error = _client_error(operation, status, headers, data)
            code = error.response["Error"]["Code"] if isinstance(error, ClientError) else ""
            throttled = code in THROTTLING_CODES
            retryable = (
                not isinstance(error, ClientError)
                or throttled
                or code in TRANSIENT_CODES
                or status in TRANSIENT_STATUSES
                or (status < 300 and not _crc_matches(headers, data))
            )
            if not retryable or attempt >= self._max_attempts:
                raise error
            time.sleep(_delay(attempt, throttled, headers.get("x-amz-retry-after")))
            attempt += 1

    def close(self) -> None:
        """Close the idle connections; a later call opens new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _attempt(self, operation: str, body: bytes) -> tuple[int, dict[str, str], bytes, Exception | None]:
        headers = self._signed_headers(operation, body)
        hooked = self._events.emit_until_response(
            f"before-send.{SERVICE}.{operation}",
            request=AWSPreparedRequest("POST", self._url, headers, body, stream_output=False),
        )[1]
        if hooked is not None:
            return hooked.status_code, {k.lower(): v for k, v in hooked.headers.items()}, hooked.content, None
        try:
            return (*self._send(headers, body), None)
        except (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError) as exc:
            return 0, {}, b"", exc

    def _send(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        connection = self._acquire()
        try:
            status, answer_headers, data = connection.exchange(self._head(headers), body)
        except TimeoutError as exc:
            connection.close()
            raise ReadTimeoutError(endpoint_url=self.endpoint_url, error=exc) from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # Sent, then no usable answer: the request may or may not have been applied.
            connection.close()
            raise ConnectionClosedError(endpoint_url=self.endpoint_url, error=exc) from exc
        except BaseException:
            connection.close()
            raise
        if connection.reusable:
            self._release(connection)
        else:
            connection.close()
        return status, answer_headers, data

    def _head(self, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self._path} HTTP/1.1"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _acquire(self) -> _Connection:
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = [], os.getpid()  # a forked child must not share its parent's sockets
            while self._idle:
                connection = self._idle.pop()
                if not connection.dropped():
                    return connection
                connection.close()
        try:
            sock = socket.create_connection((self._host, self._port or (443 if self._https else 80)),
                                            self._connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=self.endpoint_url, error=exc) from exc
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=self.endpoint_url, error=exc) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._https:
                if self._ssl is None:
                    self._ssl = ssl.create_default_context(cafile=self._ca_bundle or get_cert_path(True))
                sock = self._ssl.wrap_socket(sock, server_hostname=self._host)
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeoutError(endpoint_url=self.endpoint_url, error=exc) from exc
        except OSError as exc:
            sock.close()
            raise EndpointConnectionError(endpoint_url=self.endpoint_url, error=exc) from exc
        sock.settimeout(self._read_timeout)
        return _Connection(sock)

    def _release(self, connection: _Connection) -> None:
        with self._lock:
            self._idle.append(connection)

    def _signed_headers(self, operation: str, body: bytes) -> dict[str, str]:
        """The request's headers with a SigV4 ``Authorization`` over all of them but the length."""
        if self._credentials is None:
            raise NoCredentialsError()
        credentials = self._credentials.get_frozen_credentials()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers = {"content-type": CONTENT_TYPE, "host": self._netloc, "x-amz-date": stamp}
        if credentials.token:
            headers["x-amz-security-token"] = credentials.token
        headers["x-amz-target"] = TARGET_PREFIX + operation
        headers["authorization"] = self._authorization(headers, body, credentials)
        headers["content-length"] = str(len(body))
        return headers

    def _authorization(self, headers: dict[str, str], body: bytes, credentials: Any) -> str:
        """The SigV4 ``Authorization`` value for a POST of ``body`` with ``headers`` (lower-case names, sorted)."""
        stamp = headers["x-amz-date"]
        day = stamp[:8]
        names = ";".join(headers)
        canonical = "\n".join(
            (
                "POST",
                self._path,
                "",
                "".join(f"{name}:{' '.join(value.split())}\n" for name, value in headers.items()),
                names,
                hashlib.sha256(body).hexdigest(),
            )
        )
        scope = f"{day}/{self.region}/{SERVICE}/aws4_request"
        to_sign = "\n".join((ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()))
        signature = hmac.new(self._signing_key(credentials.secret_key, day), to_sign.encode("utf-8"), "sha256")
        return (
            f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={names}, Signature={signature.hexdigest()}"
        )

    def _signing_key(self, secret: str, day: str) -> bytes:
        # The derived key depends only on the secret and the day: four HMACs saved on every other request.
        key = self._signing_keys.get((secret, day))
        if key is None:
            key = ("AWS4" + secret).encode("utf-8")
            for part in (day, self.region, SERVICE, "aws4_request"):
                key = hmac.new(key, part.encode("utf-8"), "sha256").digest()
            self._signing_keys = {(secret, day): key}
        return key


def _base64(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not a DynamoDB request value")


def _answer(data: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(data) if data else {}
    except ValueError as exc:
        raise UnreadableAnswerError(reason=str(exc)) from exc
    if not isinstance(answer, dict):
        raise UnreadableAnswerError(reason="not a JSON object")
    return answer


def _decode(answer: dict[str, Any]) -> dict[str, Any]:
    """Binary attribute values of the returned item as bytes, as botocore returns them."""
    for key in ("Item", "Attributes"):
        for value in answer.get(key, {}).values():
            if "B" in value:
                value["B"] = base64.b64decode(value["B"])
    return answer


def _crc_matches(headers: dict[str, str], data: bytes) -> bool:
    expected = headers.get("x-amz-crc32")
    return expected is None or not expected.isdigit() or zlib.crc32(data) == int(expected)


def _client_error(operation: str, status: int, headers: dict[str, str], data: bytes) -> ClientError:
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    code = str(answer.get("__type") or headers.get("x-amzn-errortype") or "").rpartition("#")[2].partition(":")[0]
    if not code and status >= 300:
        code = str(status)
    if status < 300:
        code = "CRC32CheckFailed"
    message = str(answer.get("message") or answer.get("Message") or "")
    metadata = {"HTTPStatusCode": status, "HTTPHeaders": headers, "RequestId": headers.get("x-amzn-requestid", "")}
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": metadata}, operation)


def _delay(attempt: int, throttled: bool, retry_after: str | None) -> float:
    base = THROTTLING_BACKOFF_SECONDS if throttled else TRANSIENT_BACKOFF_SECONDS
    delay = random.random() * min(base * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS)
    if retry_after is not None and retry_after.isdigit():
        delay = max(delay, min(int(retry_after) / 1000, MAX_RETRY_AFTER_EXTRA_SECONDS + delay))
    return delay


class _Connection:
    """One kept-alive HTTP/1.1 connection: a request goes out in one write, its answer is read by its length.

    DynamoDB answers every request with a ``Content-Length``; chunked and close-delimited answers are read too.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reusable = False
        self._reader = sock.makefile("rb")

    def exchange(self, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.reusable = False
        self.sock.sendall(head + body)
        reader = self._reader
        version, status = _status_line(reader.readline(MAX_LINE_BYTES))
        headers: dict[str, str] = {}
        while True:
            line = reader.readline(MAX_LINE_BYTES)
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.partition(b":")
            if not colon or len(headers) >= MAX_HEADERS:
                raise http.client.HTTPException(f"malformed answer header {line[:40]!r}")
            headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
        length = headers.get("content-length")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            data = _read_chunked(reader)
        elif length is not None:
            data = reader.read(int(length))
            if len(data) != int(length):
                raise http.client.IncompleteRead(data, int(length) - len(data))
        else:
            data = reader.read()
            return status, headers, data
        self.reusable = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return status, headers, data

    def dropped(self) -> bool:
        """An idle kept-alive socket is readable only when the server closed it (or sent what it should not)."""
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        self._reader.close()
        self.sock.close()


def _status_line(line: bytes) -> tuple[bytes, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise http.client.RemoteDisconnected("no answer") if not line else http.client.BadStatusLine(repr(line[:40]))
    return parts[0], int(parts[1])


def _read_chunked(reader: Any) -> bytes:
    chunks = []
    while True:
        size = int(reader.readline(MAX_LINE_BYTES).split(b";", 1)[0].strip() or b"x", 16)
        if size == 0:
            while reader.readline(MAX_LINE_BYTES) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        chunk = reader.read(size)
        if len(chunk) != size:
            raise http.client.IncompleteRead(chunk, size - len(chunk))
        chunks.append(chunk)
        reader.readline(MAX_LINE_BYTES)
