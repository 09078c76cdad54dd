"""The DynamoDB store's own requests: signed as botocore signs them, understood by DynamoDB Local, retried as
botocore's standard mode retries, and failing with botocore's exception types."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.auth
import botocore.session
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from picoflow.session.dynamodb_store import CLIENT_CONFIG, MAX_ATTEMPTS, DynamoDBSessionStore
from picoflow.session.dynamodb_wire import DynamoDBWire, UnreadableAnswerError
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, DynamoTable, free_port
from tests.support.faulty_dynamodb import FaultyDynamoDB

KEYS = Credentials(DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"], DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"])


class Scripted:
    """An HTTP endpoint answering POSTs from ``answers`` (status, headers, body) and recording what it got.

    With ``close_after`` set, the server closes each connection after answering, without saying so. An answer
    with a ``framing`` header of ``chunked`` is sent in chunks, one of ``close`` without a length, then closed, one
    of ``short`` with a length it does not deliver, one of ``garbage`` as its body alone.
    """

    def __init__(self, answers: list[tuple[int, dict[str, str], bytes]], *, close_after: bool = False) -> None:
        self.answers = answers
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.connections: set[tuple[str, int]] = set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                owner.connections.add(self.client_address)
                status, headers, answer = owner.answers.pop(0) if owner.answers else (200, {}, b"{}")
                framing = headers.pop("framing", "length")
                if framing == "garbage":
                    self.wfile.write(answer)
                    self.close_connection = True
                    return
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if framing == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for start in range(0, len(answer), 7):
                        piece = answer[start : start + 7]
                        self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\nx-trailer: 1\r\n\r\n")
                elif framing == "short":
                    self.send_header("Content-Length", str(len(answer) + 100))
                    self.end_headers()
                    self.wfile.write(answer)
                elif framing == "close":
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(answer)
                else:
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                self.close_connection = close_after or framing == "close"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[type[Scripted]]:
    servers: list[Scripted] = []

    def start(*args: Any, **kwargs: Any) -> Scripted:
        server = Scripted(*args, **kwargs)
        servers.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


def wire_for(
    url: str, *, credentials: Any = KEYS, read_timeout: float = 5, attempts: int = MAX_ATTEMPTS
) -> DynamoDBWire:
    client = botocore.session.Session().create_client(
        "dynamodb",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=KEYS.access_key,
        aws_secret_access_key=KEYS.secret_key,
        config=CLIENT_CONFIG,
    )
    return DynamoDBWire(client, credentials, connect_timeout=2, read_timeout=read_timeout, max_attempts=attempts)


def error(code: str, status: int = 400, **headers: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"{code} happened"})
    return status, headers, body.encode()


def botocore_authorization(
    monkeypatch: pytest.MonkeyPatch, url: str, headers: dict[str, str], body: bytes, credentials: Credentials
) -> str:
    """What botocore's SigV4 signer writes for the same request at the same instant."""
    stamp = datetime.datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: stamp)
    # The signature covers neither the length nor the accept-encoding http.client adds; add_auth sets the date.
    skipped = ("authorization", "content-length", "x-amz-date", "accept-encoding")
    unsigned = {k: v for k, v in headers.items() if k not in skipped}
    request = AWSRequest(method="POST", url=url, data=body, headers=unsigned)
    SigV4Auth(credentials, "dynamodb", REGION).add_auth(request)
    return request.headers["Authorization"]


@pytest.mark.parametrize("token", [None, "session-token/with+odd=chars"])
def test_requests_are_signed_exactly_as_botocore_signs_them(
    scripted: type[Scripted], monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    server = scripted([])
    credentials = Credentials(KEYS.access_key, KEYS.secret_key, token)
    wire = wire_for(server.url, credentials=credentials)
    wire.call("PutItem", {"TableName": "t", "Item": {"id": {"S": "é"}, "doc": {"B": b"\x00\xff"}}})

    headers, body = server.requests[0]
    assert headers["x-amz-target"] == "DynamoDB_20120810.PutItem"
    assert headers["content-type"] == "application/x-amz-json-1.0"
    assert headers.get("x-amz-security-token") == token
    assert json.loads(body)["Item"]["doc"] == {"B": "AP8="}
    expected = botocore_authorization(monkeypatch, server.url + "/", headers, body, credentials)
    assert headers["authorization"] == expected


def test_items_written_by_the_wire_read_back_through_botocore_and_the_other_way(
    dynamodb_local_table: DynamoTable,
) -> None:
    dynamo = dynamodb_local_table
    wire = wire_for(dynamo.endpoint_url or "")
    doc = zlib.compress(b'{"x": 1}' * 50)
    item = {"id": {"S": "w"}, "revision": {"N": "7"}, "doc": {"B": doc}}
    wire.call("PutItem", {"TableName": dynamo.name, "Item": item})
    assert dynamo.client.get_item(TableName=dynamo.name, Key={"id": {"S": "w"}})["Item"]["doc"]["B"] == doc

    dynamo.client.put_item(TableName=dynamo.name, Item={"id": {"S": "b"}, "doc": {"B": b"\x01\x02"}})
    item = wire.call("GetItem", {"TableName": dynamo.name, "Key": {"id": {"S": "b"}}, "ConsistentRead": True})["Item"]
    assert item == {"id": {"S": "b"}, "doc": {"B": b"\x01\x02"}}
    assert wire.call("GetItem", {"TableName": dynamo.name, "Key": {"id": {"S": "none"}}}) == {}

    with pytest.raises(ClientError) as raised:
        wire.call(
            "PutItem",
            {"TableName": dynamo.name, "Item": {"id": {"S": "w"}}, "ConditionExpression": "attribute_not_exists(id)"},
        )
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    wire.call("DeleteItem", {"TableName": dynamo.name, "Key": {"id": {"S": "w"}}})
    assert "Item" not in dynamo.client.get_item(TableName=dynamo.name, Key={"id": {"S": "w"}})


def test_concurrent_calls_from_many_threads_share_the_connections(dynamodb_local_table: DynamoTable) -> None:
    dynamo = dynamodb_local_table
    wire = wire_for(dynamo.endpoint_url or "")

    def write_then_read(i: int) -> str:
        item = {"id": {"S": f"t{i}"}, "revision": {"N": str(i)}}
        wire.call("PutItem", {"TableName": dynamo.name, "Item": item})
        got = wire.call("GetItem", {"TableName": dynamo.name, "Key": {"id": {"S": f"t{i}"}}, "ConsistentRead": True})
        return got["Item"]["revision"]["N"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(write_then_read, range(64))) == [str(i) for i in range(64)]
    assert len(wire._idle) <= 8
    wire.close()


def test_throttling_is_retried_after_the_servers_hint_then_succeeds() -> None:
    with FaultyDynamoDB(retry_after_ms=300) as fake:
        fake.plan["GetItem"] = ["throttle", "throughput", "throttle"]
        wire = wire_for(fake.endpoint_url)
        with pytest.raises(ClientError) as raised:
            wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
        times = fake.attempts("GetItem")
    assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    assert len(times) == MAX_ATTEMPTS
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(0.29 <= gap < 3.5 for gap in gaps), gaps


def test_a_throttle_that_clears_succeeds_and_a_refusal_is_not_retried(scripted: type[Scripted]) -> None:
    server = scripted([error("ThrottlingException"), (200, {}, b'{"Item": {"id": {"S": "a"}}}')])
    wire = wire_for(server.url)
    assert wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}) == {"Item": {"id": {"S": "a"}}}
    assert len(server.requests) == 2

    server.answers = [error("ValidationException"), (200, {}, b"{}")]
    with pytest.raises(ClientError) as raised:
        wire.call("PutItem", {"TableName": "t", "Item": {"id": {"S": "a"}}})
    assert raised.value.response["Error"] == {"Code": "ValidationException", "Message": "ValidationException happened"}
    assert len(server.requests) == 3, "a refused request is final"


def test_server_errors_and_a_corrupt_answer_are_retried(scripted: type[Scripted]) -> None:
    good = b'{"Item": {"id": {"S": "a"}}}'
    server = scripted([(500, {}, b"not json"), (200, {"x-amz-crc32": str(zlib.crc32(good) ^ 1)}, good)])
    wire = wire_for(server.url)
    server.answers.append((200, {"x-amz-crc32": str(zlib.crc32(good))}, good))
    assert wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})["Item"] == {"id": {"S": "a"}}
    assert len(server.requests) == 3

    server.answers = [(503, {}, b"")] * MAX_ATTEMPTS
    with pytest.raises(ClientError) as raised:
        wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    assert raised.value.response["Error"]["Code"] == "503"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error(scripted: type[Scripted]) -> None:
    server = scripted([], close_after=True)
    wire = wire_for(server.url, attempts=1)
    for _ in range(3):
        assert wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}) == {}
        time.sleep(0.05)  # the server's close reaches the idle socket
    assert len(server.requests) == 3 and len(server.connections) == 3


def test_chunked_and_close_delimited_answers_are_read(scripted: type[Scripted]) -> None:
    item = b'{"Item": {"id": {"S": "a long enough identifier"}, "doc": {"B": "AP8="}}}'
    server = scripted([(200, {"framing": "chunked"}, item), (200, {"framing": "close"}, item), (200, {}, item)])
    wire = wire_for(server.url, attempts=1)
    expected = {"Item": {"id": {"S": "a long enough identifier"}, "doc": {"B": b"\x00\xff"}}}
    for _ in range(3):
        assert wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}) == expected
    # The chunked answer's connection was kept; the close-delimited one could not be.
    assert len(server.connections) == 2


def test_a_cut_off_or_garbled_answer_is_a_connection_closed_error(scripted: type[Scripted]) -> None:
    server = scripted([(200, {"framing": "short"}, b"{}")], close_after=True)
    wire = wire_for(server.url, attempts=1)
    with pytest.raises(ConnectionClosedError):
        wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    server.answers = [(200, {"framing": "garbage"}, b"SSH-2.0-OpenSSH\r\n\r\n")]
    with pytest.raises(ConnectionClosedError):
        wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    server.answers = [(200, {}, b"<html>a captive portal</html>")]
    with pytest.raises(UnreadableAnswerError):
        wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})


def test_no_listener_is_a_connection_error_after_the_bounded_attempts() -> None:
    wire = wire_for(f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(EndpointConnectionError):
        wire.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    assert time.monotonic() - started < 1.0


def test_a_dropped_answer_and_a_late_one_are_http_client_errors() -> None:
    with FaultyDynamoDB() as fake:
        fake.plan["PutItem"] = ["drop"] * MAX_ATTEMPTS
        with pytest.raises(ConnectionClosedError):
            wire_for(fake.endpoint_url).call("PutItem", {"TableName": "t", "Item": {"id": {"S": "a"}}})
        assert fake.counts()["PutItem"] == MAX_ATTEMPTS

        fake.plan["GetItem"] = ["hold"]
        started = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            wire_for(fake.endpoint_url, read_timeout=0.3, attempts=1).call(
                "GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}
            )
        assert time.monotonic() - started < 2.0


def test_missing_credentials_fail_before_anything_is_sent(scripted: type[Scripted]) -> None:
    server = scripted([])
    with pytest.raises(botocore.exceptions.NoCredentialsError):
        wire_for(server.url, credentials=None).call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    assert server.requests == []


async def test_behind_a_proxy_the_store_sends_through_botocore(
    scripted: type[Scripted], monkeypatch: pytest.MonkeyPatch, aws_credentials: None
) -> None:
    proxy = scripted([])
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    store = DynamoDBSessionStore("sessions", endpoint_url="http://dynamodb.example.invalid", region_name=REGION)
    assert await store.load("abc") is None
    headers, _ = proxy.requests[0]
    assert headers["x-amz-target"] == "DynamoDB_20120810.GetItem"
    assert headers["host"] == "dynamodb.example.invalid"
    await store.close()


@pytest.mark.parametrize("directly", [True, False])
async def test_send_directly_chooses_who_sends_the_requests(dynamodb_local_table: DynamoTable, directly: bool) -> None:
    store = dynamodb_local_table.store()
    store.send_directly = directly
    calls: list[str] = []
    sends: list[str] = []
    # botocore announces an API call (before-call) only when it makes the call itself; both paths announce the send.
    store.client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    store.client.meta.events.register("before-send.dynamodb", lambda request, **_: sends.append(request.method))
    doc = await store.create({"name": "Flow", "id": "f"})
    assert (await store.load(doc.id)).id == doc.id
    assert sends == ["POST", "POST"]
    assert calls == ([] if directly else ["PutItem", "GetItem"])
    await store.close()


def self_signed_certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_https_endpoints_are_verified_against_the_ca_bundle(scripted: type[Scripted], tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server = scripted([(200, {}, b'{"Item": {"id": {"S": "a"}}}')])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
    url = server.url.replace("http://", "https://")
    client = botocore.session.Session().create_client(
        "dynamodb", endpoint_url=url, region_name=REGION, aws_access_key_id="a", aws_secret_access_key="b"
    )

    def wire(ca_bundle: str | None) -> DynamoDBWire:
        return DynamoDBWire(client, KEYS, connect_timeout=2, read_timeout=5, max_attempts=1, ca_bundle=ca_bundle)

    trusted = wire(str(cert))
    assert trusted.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}) == {"Item": {"id": {"S": "a"}}}
    assert trusted.call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}}) == {}  # the kept connection
    assert len(server.connections) == 1
    # The default bundle does not know this certificate: no request is sent over an unverified connection.
    with pytest.raises(EndpointConnectionError):
        wire(None).call("GetItem", {"TableName": "t", "Key": {"id": {"S": "a"}}})
    assert len(server.requests) == 2
