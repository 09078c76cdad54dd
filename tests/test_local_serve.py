import base64
import http.client
import io
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, CORSConfig, Response

import handlers.api
from picoflow import Flow, ModelSelection, Step
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.local.chat import chat
from picoflow.local.cli import main
from picoflow.local.serve import LambdaHTTPServer, make_server

EVENTS = Path(__file__).resolve().parent.parent / "events"


class FakeLambda:
    """Records every event and answers with ``respond(event)``: by default an echo of the event."""

    def __init__(self, respond: Callable[[dict], Any] | None = None) -> None:
        self.events: list[dict] = []
        self.contexts: list[Any] = []
        self.respond = respond or (lambda event: {"statusCode": 200, "body": json.dumps(event)})

    def __call__(self, event: dict, context: Any) -> Any:
        self.events.append(event)
        self.contexts.append(context)
        return self.respond(event)


@pytest.fixture
def start_server() -> Iterator[Callable[[Callable], str]]:
    servers = []

    def start(handler: Callable) -> str:
        server = make_server("127.0.0.1", 0, handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


# --- the request -> event translation ---------------------------------------------------------


def test_post_becomes_a_v2_event(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    body = json.dumps({"flowName": "HotelFlow", "message": "Hi"}).encode()
    headers = {"Content-Type": "application/json", "CHAT_SESSION_ID": "abc", "X-Mixed-Case": "v"}
    status, _, _ = request(url, "POST", "/ai/run", body, headers)
    assert status == 200
    (event,) = fake.events
    assert event["version"] == "2.0"
    assert event["routeKey"] == "POST /ai/run"
    assert event["rawPath"] == "/ai/run"
    assert event["rawQueryString"] == ""
    assert event["isBase64Encoded"] is False
    assert json.loads(event["body"]) == {"flowName": "HotelFlow", "message": "Hi"}
    assert event["headers"]["chat_session_id"] == "abc"
    assert event["headers"]["x-mixed-case"] == "v"
    assert event["headers"]["content-type"] == "application/json"
    assert event["headers"]["content-length"] == str(len(body))
    assert event["headers"]["x-forwarded-proto"] == "http"
    assert all(name == name.lower() for name in event["headers"])
    context = event["requestContext"]
    assert context["http"]["method"] == "POST"
    assert context["http"]["path"] == "/ai/run"
    assert context["http"]["sourceIp"] == "127.0.0.1"
    assert context["stage"] == "$default"
    assert context["requestId"]
    assert "queryStringParameters" not in event


def test_get_with_query_and_no_body(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    request(url, "GET", "/ai/flows?a=1&a=2&b=")
    (event,) = fake.events
    assert event["requestContext"]["http"]["method"] == "GET"
    assert event["rawPath"] == "/ai/flows"
    assert event["rawQueryString"] == "a=1&a=2&b="
    assert event["queryStringParameters"] == {"a": "1,2", "b": ""}
    assert "body" not in event


def test_binary_body_is_base64_encoded(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    payload = bytes(range(256))
    request(url, "POST", "/upload", payload, {"Content-Type": "application/octet-stream"})
    (event,) = fake.events
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == payload


def test_chunked_body_is_reassembled(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/ai/run", body=iter([b'{"flowName":', b'"F"}']), headers={"Content-Type": "application/json"},
                 encode_chunked=True)
    assert conn.getresponse().status == 200
    conn.close()
    assert json.loads(fake.events[0]["body"]) == {"flowName": "F"}


def test_payload_over_the_gateway_limit_is_refused_without_invoking(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/ai/run")
    conn.putheader("Content-Length", str(11 * 1024 * 1024))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    conn.close()
    assert fake.events == []


def test_handler_gets_a_lambda_context(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    request(url, "GET", "/health")
    (context,) = fake.contexts
    assert context.function_name
    assert context.memory_limit_in_mb == 1024
    assert context.invoked_function_arn.startswith("arn:aws:lambda:")
    assert context.aws_request_id
    assert 0 < context.get_remaining_time_in_millis() <= 25_000


# --- the proxy response -> HTTP translation ---------------------------------------------------


def test_status_headers_and_body_are_written_back(start_server):
    url = start_server(FakeLambda(lambda event: {
        "statusCode": 409,
        "headers": {"Content-Type": "application/json", "CHAT_SESSION_ID": "s-1"},
        "body": '{"success":false,"code":"SESSION_CONFLICT"}',
        "isBase64Encoded": False,
    }))
    status, headers, body = request(url, "POST", "/ai/run", b"{}")
    assert status == 409
    assert headers["chat_session_id"] == "s-1"
    assert "CHAT_SESSION_ID" in [name for name, _ in headers.items()]  # spelling kept, not just matched
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"success": False, "code": "SESSION_CONFLICT"}


def test_base64_response_is_decoded(start_server):
    payload = b"\x89PNG\r\n\x1a\n\x00\xff"
    url = start_server(FakeLambda(lambda event: {
        "statusCode": 200,
        "headers": {"Content-Type": "image/png"},
        "body": base64.b64encode(payload).decode(),
        "isBase64Encoded": True,
    }))
    status, headers, body = request(url, "GET", "/img")
    assert (status, headers["content-type"], body) == (200, "image/png", payload)
    assert headers["content-length"] == str(len(payload))


def test_multi_value_headers_and_cookies(start_server):
    url = start_server(FakeLambda(lambda event: {
        "statusCode": 201,
        "headers": {"X-One": "1"},
        "multiValueHeaders": {"X-Many": ["a", "b"]},
        "cookies": ["a=1; Path=/", "b=2; HttpOnly"],
        "body": "created",
    }))
    status, headers, body = request(url, "POST", "/x", b"")
    assert status == 201
    assert headers["x-one"] == "1"
    assert headers.get_all("x-many") == ["a", "b"]
    assert headers.get_all("set-cookie") == ["a=1; Path=/", "b=2; HttpOnly"]
    assert body == b"created"


def test_request_cookies_reach_the_event(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    request(url, "GET", "/", headers={"Cookie": "a=1; b=2"})
    assert fake.events[0]["cookies"] == ["a=1", "b=2"]
    assert "cookie" not in fake.events[0]["headers"]


def test_plain_return_value_is_a_json_200(start_server):
    url = start_server(FakeLambda(lambda event: ["BasicFlow", "HotelFlow"]))
    status, headers, body = request(url, "GET", "/ai/flows")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == ["BasicFlow", "HotelFlow"]


def test_handler_exception_is_a_bare_500(start_server, capsys):
    def explode(event):
        raise RuntimeError("boom")

    url = start_server(FakeLambda(explode))
    status, _, body = request(url, "POST", "/ai/run", b"{}")
    assert status == 500
    assert json.loads(body) == {"message": "Internal Server Error"}
    assert "boom" in capsys.readouterr().err


# --- HTTP framing and methods: the server's own answers, as API Gateway gives them ----------------


def raw_exchange(url: str, data: bytes, *, half_close: bool = False) -> tuple[int, Any, bytes, bytes]:
    """Send ``data`` verbatim; return the response's status, headers, body and whatever follows it.

    The last item is ``b""`` when the server closed the connection after the response, so a test reading
    it also knows the server has finished with the request (and written anything it logs).
    """
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method=data.split(b" ", 1)[0].decode())
        response.begin()
        body = response.read()
        return response.status, response.headers, body, sock.recv(1)


def assert_gateway_error(exchange, status: int, message: str) -> None:
    code, headers, body, after = exchange
    assert code == status
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert json.loads(body) == {"message": message}
    assert after == b""  # the connection was closed


@pytest.mark.parametrize("length", ["abc", "-1", "+3", "0x3", "1_0", "3, 4", ""])
def test_malformed_content_length_is_a_400_without_invoking(start_server, capsys, length):
    fake = FakeLambda()
    url = start_server(fake)
    data = f"POST /ai/run HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\nabc".encode()
    assert_gateway_error(raw_exchange(url, data), 400, "Bad Request")
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


def test_conflicting_repeated_content_lengths_are_a_400(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    data = b"POST /ai/run HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 2\r\n\r\nabc"
    assert_gateway_error(raw_exchange(url, data), 400, "Bad Request")
    assert fake.events == []


def test_agreeing_repeated_content_lengths_are_accepted(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    framing = b"Content-Type: text/plain\r\nContent-Length: 3\r\nContent-Length: 3\r\nConnection: close\r\n"
    data = b"POST /ai/run HTTP/1.1\r\n" + framing + b"\r\nabc"
    status, _, _, _ = raw_exchange(url, data)
    assert status == 200
    assert fake.events[0]["body"] == "abc"


@pytest.mark.parametrize(
    "chunks",
    [
        b"zz\r\n",  # not a hex size
        b"-1\r\n",
        b"0x3\r\nabc\r\n0\r\n\r\n",
        b"\r\n",  # no size at all
        b"3\r\nabcde\r\n0\r\n\r\n",  # more data than the size announced
        b"3\r\nabc" + b"x" * 70_000 + b"\r\n",  # an endless line where the chunk should end
    ],
    ids=["not-hex", "negative", "0x-prefix", "empty-size", "overlong-chunk", "endless-line"],
)
def test_malformed_chunk_is_a_400_without_invoking(start_server, capsys, chunks):
    fake = FakeLambda()
    url = start_server(fake)
    data = b"POST /ai/run HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    assert_gateway_error(raw_exchange(url, data), 400, "Bad Request")
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


def test_chunk_extensions_and_trailers_are_accepted(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    chunks = b"3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
    framing = b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    data = b"POST /ai/run HTTP/1.1\r\n" + framing + b"\r\n" + chunks
    status, _, _, _ = raw_exchange(url, data)
    assert status == 200
    assert fake.events[0]["body"] == "abcde"


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
    ],
    ids=["length-then-chunked", "chunked-then-length", "gzip", "gzip-chunked"],
)
def test_ambiguous_or_unknown_framing_is_a_400_without_invoking(start_server, capsys, framing):
    fake = FakeLambda()
    url = start_server(fake)
    data = b"POST /ai/run HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n3\r\nabc\r\n0\r\n\r\n"
    assert_gateway_error(raw_exchange(url, data), 400, "Bad Request")
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("framing", "partial"),
    [
        (b"Content-Length: 10\r\n", b"abc"),
        (b"Transfer-Encoding: chunked\r\n", b"a\r\nabc"),  # inside a chunk
        (b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n"),  # before the last chunk
        (b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n"),  # before the end of the trailers
        (b"Transfer-Encoding: chunked\r\n", b"3"),  # inside a size line
    ],
    ids=["content-length", "in-chunk", "before-last-chunk", "in-trailers", "in-size-line"],
)
def test_body_cut_short_is_not_invoked(start_server, capsys, framing, partial):
    fake = FakeLambda()
    url = start_server(fake)
    data = b"POST /ai/run HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + partial
    # The client stops sending; one that still listens hears a 400.
    assert_gateway_error(raw_exchange(url, data, half_close=True), 400, "Bad Request")
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


def test_client_gone_mid_body_is_closed_quietly(start_server, capsys, monkeypatch):
    done = threading.Event()
    shutdown_request = LambdaHTTPServer.shutdown_request

    def finished(self, request):
        shutdown_request(self, request)
        done.set()

    monkeypatch.setattr(LambdaHTTPServer, "shutdown_request", finished)
    fake = FakeLambda()
    url = start_server(fake)
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /ai/run HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    # Close with a reset, so answering the client fails too.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert done.wait(10)
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


def test_server_errors_other_than_a_gone_client_are_still_reported(capsys):
    server = make_server("127.0.0.1", 0, FakeLambda())
    try:
        for error in (BrokenPipeError(), ConnectionResetError(), ValueError("real fault")):
            try:
                raise error
            except Exception:
                server.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.server_close()
    err = capsys.readouterr().err
    assert "real fault" in err
    assert "BrokenPipeError" not in err and "ConnectionResetError" not in err


def test_head_is_answered_as_the_get_without_a_body(start_server):
    def respond(event):
        if event["routeKey"] != "GET /health":
            return {"statusCode": 404, "body": "{}"}
        return {"statusCode": 200, "headers": {"Content-Type": "application/json", "X-Check": "1"},
                "body": '{"status":"ok"}'}

    fake = FakeLambda(respond)
    url = start_server(fake)
    raw = b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, get = re.split(rb"(?=HTTP/1\.1 )", received)[1:]
    # The HEAD answer is the GET's status line and headers with no body bytes before the next response.
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 15\r\n" in head and b"X-Check: 1\r\n" in head
    assert get.endswith(b'\r\n\r\n{"status":"ok"}')
    assert [event["routeKey"] for event in fake.events] == ["GET /health", "GET /health"]
    assert fake.events[0]["requestContext"]["http"]["method"] == "GET"


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "POST", "GET"])
def test_route_methods_reach_the_handler(start_server, method):
    fake = FakeLambda(lambda event: {"statusCode": 404, "body": '{"success":false,"code":"NOT_FOUND"}'})
    url = start_server(fake)
    status, _, body = request(url, method, "/ai/run", b"{}" if method in ("PUT", "PATCH", "POST") else None)
    assert (status, json.loads(body)) == (404, {"success": False, "code": "NOT_FOUND"})
    (event,) = fake.events
    assert event["routeKey"] == f"{method} /ai/run"
    assert event["requestContext"]["http"]["method"] == method


def test_cors_preflight_is_the_handlers_to_answer(start_server):
    app = APIGatewayHttpResolver(cors=CORSConfig(allow_origin="https://app.example.com", max_age=60))

    @app.post("/ai/run")
    def run():
        return {}

    url = start_server(lambda event, context: app.resolve(event, context))
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
    status, headers, _ = request(url, "OPTIONS", "/ai/run", headers=preflight)
    assert status == 204
    assert headers["access-control-allow-origin"] == "https://app.example.com"
    assert "POST" in headers["access-control-allow-methods"]


@pytest.mark.parametrize("method", ["BREW", "TRACE", "CONNECT", "get"])
def test_unknown_method_is_a_405_without_invoking(start_server, capsys, method):
    fake = FakeLambda()
    url = start_server(fake)
    exchange = raw_exchange(url, f"{method} /ai/run HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    assert_gateway_error(exchange, 405, "Method Not Allowed")
    assert set(exchange[1]["allow"].split(", ")) == {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
    assert fake.events == []
    assert "Traceback" not in capsys.readouterr().err


def test_the_servers_own_header_errors_are_json_too(start_server):
    fake = FakeLambda()
    url = start_server(fake)
    data = b"GET /health HTTP/1.1\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n"
    assert_gateway_error(raw_exchange(url, data), 431, "Request Header Fields Too Large")
    assert fake.events == []


# --- http_event and the sample events against Powertools' own resolver ------------------------


def _resolver() -> APIGatewayHttpResolver:
    app = APIGatewayHttpResolver()

    @app.post("/ai/run")
    def run():
        event = app.current_event
        return {
            "route": "run",
            "body": event.json_body,
            "session": event.headers.get("chat_session_id"),
        }

    @app.post("/ai/end")
    def end():
        return {"route": "end", "session": app.current_event.headers.get("chat_session_id")}

    @app.get("/ai/flows")
    def flows():
        return Response(200, "application/json", json.dumps(["HotelFlow"]))

    return app


@pytest.mark.parametrize(
    ("name", "route", "session"),
    [
        ("run-first-turn", "run", None),
        ("run-follow-up", "run", "66f1c2a9d4b83e0a5c7d1e29"),
        ("end-session", "end", "66f1c2a9d4b83e0a5c7d1e29"),
    ],
)
def test_sample_events_route_through_powertools(name, route, session):
    event = json.loads((EVENTS / f"{name}.json").read_text())
    assert event["version"] == "2.0"
    assert event["requestContext"]["stage"] == "$default"
    assert all(header == header.lower() for header in event["headers"])
    response = _resolver().resolve(event, FakeLambdaContext())
    assert response["statusCode"] == 200
    result = json.loads(response["body"])
    assert result["route"] == route
    assert result["session"] == session
    if route == "run":
        assert result["body"]["flowName"] == "HotelFlow"


def test_first_turn_event_carries_config():
    event = json.loads((EVENTS / "run-first-turn.json").read_text())
    body = json.loads(event["body"])
    assert body["config"] == {"tenantId": "demo"}
    assert isinstance(body["message"], str) and body["message"]
    assert "chat_session_id" not in event["headers"]


def test_list_flows_event():
    event = json.loads((EVENTS / "list-flows.json").read_text())
    response = _resolver().resolve(event, FakeLambdaContext())
    assert json.loads(response["body"]) == ["HotelFlow"]


def test_http_event_json_body_and_headers():
    event = http_event(
        "post", "/ai/run", body={"flowName": "F"}, headers=[("CHAT_SESSION_ID", "s"), ("Accept", "a"), ("accept", "b")]
    )
    assert event["routeKey"] == "POST /ai/run"
    assert event["headers"]["content-type"] == "application/json"
    assert event["headers"]["accept"] == "a,b"
    assert event["headers"]["chat_session_id"] == "s"
    response = _resolver().resolve(event, FakeLambdaContext())
    assert json.loads(response["body"]) == {"route": "run", "body": {"flowName": "F"}, "session": "s"}


def test_http_event_query_mapping():
    event = http_event("GET", "/ai/flows", query={"a": ["1", "2"], "b": "x y"})
    assert event["rawQueryString"] == "a=1&a=2&b=x+y"
    assert event["queryStringParameters"] == {"a": "1,2", "b": "x y"}


def test_http_event_base64_body_is_decoded_by_powertools():
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    event = http_event("POST", "/ai/run", body=b'{"flowName":"F"}', headers=form)
    assert event["isBase64Encoded"] is True
    assert json.loads(_resolver().resolve(event, FakeLambdaContext())["body"])["body"] == {"flowName": "F"}


def test_fake_context_deadline_counts_down():
    assert FakeLambdaContext(timeout_ms=0).get_remaining_time_in_millis() == 0
    assert 9_000 < FakeLambdaContext(timeout_ms=10_000).get_remaining_time_in_millis() <= 10_000


# --- the chat client ---------------------------------------------------------------------------


class FakeFlowApi:
    """A tiny stand-in for the real handler: numbered sessions, 'bye' completes, 'clash' conflicts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, dict | None]] = []
        self.counter = 0

    def __call__(self, event: dict, context: Any) -> dict:
        session = event["headers"].get("chat_session_id")
        body = json.loads(event["body"]) if event.get("body") else None
        self.calls.append((event["rawPath"], session, body))
        if event["rawPath"] == "/ai/end":
            return _json(200, {"success": True, "session": session or ""}, session)
        if session is None:
            self.counter += 1
            session = f"s{self.counter}"
        message = body["message"]
        if message == "clash":
            envelope = {"success": False, "completed": False, "message": "changed by another request",
                        "session": session, "code": "SESSION_CONFLICT"}
            return _json(409, envelope, session)
        if message == "table":
            return {"statusCode": 200, "headers": {"Content-Type": "text/markdown", "CHAT_SESSION_ID": session},
                    "body": "| a |\n| - |"}
        envelope = {"success": True, "completed": message == "bye", "message": f"echo: {message}",
                    "session": session, "contentType": "text/plain"}
        return _json(200, envelope, session)


def _json(status: int, payload: dict, session: str | None) -> dict:
    headers = {"Content-Type": "application/json"}
    if session:
        headers["CHAT_SESSION_ID"] = session
    return {"statusCode": status, "headers": headers, "body": json.dumps(payload)}


def test_chat_carries_the_session_header_between_turns(start_server):
    api = FakeFlowApi()
    url = start_server(api)
    script = "hello\n\nmore\nclash\ntable\n/end\nagain\nbye\nnext\n/end\n"
    out = io.StringIO()
    assert chat("HotelFlow", url, {"tenantId": "demo"}, stdin=io.StringIO(script), stdout=out) == 0

    config = {"tenantId": "demo"}
    assert api.calls == [
        ("/ai/run", None, {"flowName": "HotelFlow", "message": "hello", "config": config}),
        ("/ai/run", "s1", {"flowName": "HotelFlow", "message": "more"}),
        ("/ai/run", "s1", {"flowName": "HotelFlow", "message": "clash"}),
        ("/ai/run", "s1", {"flowName": "HotelFlow", "message": "table"}),
        ("/ai/end", "s1", None),
        ("/ai/run", None, {"flowName": "HotelFlow", "message": "again", "config": config}),
        ("/ai/run", "s2", {"flowName": "HotelFlow", "message": "bye"}),
        ("/ai/run", None, {"flowName": "HotelFlow", "message": "next", "config": config}),
        ("/ai/end", "s3", None),
    ]
    text = out.getvalue()
    assert "[session s1]" in text
    assert "HotelFlow> echo: hello" in text
    assert "[error 409 SESSION_CONFLICT] changed by another request" in text
    assert "HotelFlow (text/markdown)> | a |" in text
    assert "[session s1 ended]" in text
    assert "[session completed" in text
    assert "[session s3]" in text


def test_chat_end_without_session_sends_nothing(start_server):
    api = FakeFlowApi()
    url = start_server(api)
    out = io.StringIO()
    assert chat("F", url, stdin=io.StringIO("/end\n"), stdout=out) == 0
    assert api.calls == []
    assert "[no session to end]" in out.getvalue()


def test_chat_reports_an_unreachable_server():
    server = make_server("127.0.0.1", 0, FakeLambda())
    url = server.url
    server.server_close()
    out = io.StringIO()
    assert chat("F", url, stdin=io.StringIO("hi\n"), stdout=out) == 1
    assert "cannot reach" in out.getvalue()


def test_cli_chat_subcommand(start_server, monkeypatch, capsys):
    api = FakeFlowApi()
    url = start_server(api)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", "BasicFlow", "--url", url, "--config", '{"tenantId": "t"}']) == 0
    assert api.calls == [("/ai/run", None, {"flowName": "BasicFlow", "message": "hi", "config": {"tenantId": "t"}})]
    assert "BasicFlow> echo: hi" in capsys.readouterr().out


def test_cli_rejects_a_non_object_config():
    with pytest.raises(SystemExit) as exit_info:
        main(["chat", "F", "--config", "[1]"])
    assert exit_info.value.code == 2


# --- end to end: the real Lambda handler behind the local server ---------------------------------


class GreetStep(Step):
    def get_prompt(self) -> str:
        return "Greet the user."


class GreeterFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [GreetStep(self)]


@pytest.fixture
def real_handler_env(tmp_path, monkeypatch) -> Iterator[None]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "Hello there"}, {"content": "Still here"}]))
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("PICOFLOW_FLOWS", __name__)
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield
    runtime = aws_runtime._runtime
    if runtime is not None:
        runtime.loop.call_soon_threadsafe(runtime.loop.stop)


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_chat_through_the_real_handler(real_handler_env, start_server, capsys):
    url = start_server(handlers.api.lambda_handler)
    status, _, body = request(url, "GET", "/ai/flows")
    assert (status, json.loads(body)) == (200, ["GreeterFlow"])

    out = io.StringIO()
    script = "hi\nand again\n/end\n"
    assert chat("GreeterFlow", url, {"tenantId": "demo"}, stdin=io.StringIO(script), stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert "GreeterFlow> Hello there" in lines
    assert "GreeterFlow> Still here" in lines
    (session,) = [m.group(1) for line in lines if (m := re.fullmatch(r"\[session (\w+)\]", line))]
    assert f"[session {session} ended]" in lines


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_head_and_options_through_the_real_handler(real_handler_env, start_server):
    url = start_server(handlers.api.lambda_handler)
    get_status, get_headers, get_body = request(url, "GET", "/health")
    head_status, head_headers, head_body = request(url, "HEAD", "/health")
    assert (get_status, json.loads(get_body)) == (200, {"status": "ok"})
    assert (head_status, head_body) == (200, b"")
    assert head_headers["content-length"] == get_headers["content-length"] == str(len(get_body))
    assert head_headers["content-type"] == get_headers["content-type"]
    # Without CORS the handler has no OPTIONS route: its own 404, not a refusal by the server.
    status, _, body = request(url, "OPTIONS", "/ai/run")
    assert status == 404
    assert json.loads(body) != {"message": "Method Not Allowed"}


def test_default_server_uses_the_project_handler(real_handler_env):
    server = make_server("127.0.0.1", 0)
    try:
        assert server.lambda_handler is handlers.api.lambda_handler
    finally:
        server.server_close()


def test_serve_command_sets_up_the_environment(monkeypatch, capsys):
    for name in ("SESSION_STORE", "PICOFLOW_FLOWS"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)

    def interrupted(self, poll_interval=0.5):
        raise KeyboardInterrupt

    monkeypatch.setattr(LambdaHTTPServer, "serve_forever", interrupted)
    assert main(["serve", "--port", "0", "--flows", "flows.hotel"]) == 0
    assert os.environ["SESSION_STORE"] == "SQLITE"
    assert os.environ["PICOFLOW_FLOWS"] == "flows.hotel"
    assert "listening on http://127.0.0.1:" in capsys.readouterr().out
