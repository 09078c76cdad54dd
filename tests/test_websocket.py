"""The WebSocket API's handler on moto's apigatewaymanagementapi: turns per message, events posted as they happen,
a client that leaves mid-turn, keyed retries, refusals and the connect authorizer's JWT rules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from moto import mock_aws

import handlers.websocket
import handlers.websocket_authorizer
from picoflow.aws import runtime as aws_runtime
from picoflow.aws import websocket, ws_authorizer

ENDPOINT = "https://abc123.execute-api.us-east-1.amazonaws.com/live"
REPLY = "The blue room is free on Friday."
KEY = "5b0e6c1e-1d8f-4f52-9f55-0a1b2c3d4e5f"


class Lambda:
    aws_request_id = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 25_000


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[list[dict[str, Any]]], None]:
    def write(replies: list[dict[str, Any]]) -> None:
        script = tmp_path / "script.json"
        script.write_text(json.dumps(replies))
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))

    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("PICOFLOW_FLOWS", "tests.support.tiny_flow")
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield write
    runtime = aws_runtime._runtime
    if runtime is not None:
        runtime.loop.call_soon_threadsafe(runtime.loop.stop)


class Connection:
    """A moto ``apigatewaymanagementapi`` client recording what is posted to each connection (botocore's public
    ``provide-client-params`` event), joining ``part`` messages as a client does; after ``gone_after`` posts the
    client has left (``GoneException``); a message over 128 KB is refused (``PayloadTooLargeException``)."""

    def __init__(self, gone_after: int | None = None) -> None:
        self.client = boto3.client("apigatewaymanagementapi", region_name="us-east-1", endpoint_url=ENDPOINT)
        self.posts: list[dict[str, Any]] = []
        #: The size of every message posted, parts included.
        self.sizes: list[int] = []
        self.joined = websocket.Reassembler()
        self.gone_after = gone_after
        self.client.meta.events.register("provide-client-params.apigatewaymanagementapi.PostToConnection", self._post)

    def _post(self, params: dict[str, Any], **_: Any) -> None:
        if self.gone_after is not None and len(self.posts) >= self.gone_after:
            raise self.client.exceptions.GoneException(
                {"Error": {"Code": "GoneException", "Message": "gone"}}, "PostToConnection"
            )
        if len(params["Data"]) > 128 * 1024:
            # The real service's limit on one message, which moto does not apply.
            raise self.client.exceptions.PayloadTooLargeException(
                {"Error": {"Code": "PayloadTooLargeException", "Message": "too large"}}, "PostToConnection"
            )
        self.sizes.append(len(params["Data"]))
        event = self.joined.add(params["Data"].decode("utf-8"))
        if event is not None:
            self.posts.append({"connection": params["ConnectionId"], **event})

    def events(self) -> list[str]:
        return [post["event"] for post in self.posts]

    def final(self) -> dict[str, Any]:
        assert self.posts and self.posts[-1]["event"] in ("committed", "aborted"), self.posts
        return self.posts[-1]["data"]


def message(body: Any, *, principal: str | None = None, connection_id: str = "conn-1") -> dict[str, Any]:
    context: dict[str, Any] = {
        "routeKey": "$default", "eventType": "MESSAGE", "connectionId": connection_id, "requestId": "r-1",
        "domainName": "abc123.execute-api.us-east-1.amazonaws.com", "stage": "live",
    }
    if principal is not None:
        context["authorizer"] = {"principalId": principal, "principal": principal}
    text = body if isinstance(body, str) else json.dumps(body)
    return {"requestContext": context, "body": text, "isBase64Encoded": False}


def send(connection: Connection, body: Any, **kwargs: Any) -> dict[str, Any]:
    return websocket.handle(message(body, **kwargs), Lambda(), connection.client)


@mock_aws
def test_a_message_runs_a_turn_and_posts_its_events_as_they_happen(scripted):
    scripted([{"content": REPLY, "chunk_delay": 0.01}, {"content": "Anything else?"}])
    first = Connection()
    assert send(first, {"flowName": "TinyFlow", "message": "A room for Friday?"}) == {"statusCode": 200}
    assert first.events()[-1] == "committed"
    assert first.events().count("delta") > 3
    assert {post["connection"] for post in first.posts} == {"conn-1"}
    deltas = "".join(post["data"]["text"] for post in first.posts if post["event"] == "delta")
    final = first.final()
    assert deltas == final["message"] == REPLY
    assert final["success"] is True and final["contentType"] == "text/plain"

    again = Connection()
    send(again, {"flowName": "TinyFlow", "message": "Thanks", "session": final["session"]})
    assert again.final()["session"] == final["session"]
    assert again.final()["message"] == "Anything else?"


@mock_aws
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("{not json", "BAD_REQUEST"),
        ({"message": "no flow"}, "BAD_REQUEST"),
        ({"flowName": "TinyFlow", "message": "hi", "session": "../etc"}, "BAD_REQUEST"),
        ({"flowName": "TinyFlow", "message": "hi", "idempotencyKey": "\u00e9"}, "BAD_REQUEST"),
        ({"flowName": "TinyFlow", "message": "x" * 100_001}, "MESSAGE_TOO_LARGE"),
        ({"flowName": "NoSuchFlow", "message": "hi"}, "FLOW_NOT_FOUND"),
    ],
)
def test_a_refused_message_gets_one_aborted_event(scripted, body, code):
    scripted([])
    connection = Connection()
    send(connection, body)
    assert connection.events() == ["aborted"]
    assert connection.final()["code"] == code
    assert connection.final()["success"] is False


@mock_aws
def test_a_client_gone_mid_turn_does_not_stop_it_and_a_keyed_retry_gets_the_committed_answer(scripted):
    # One reply only: a second model call would fail, so the retry must be answered from the receipt.
    scripted([{"content": REPLY, "chunk_delay": 0.01}])
    leaving = Connection(gone_after=1)
    body = {"flowName": "TinyFlow", "message": "A room for Friday?", "idempotencyKey": KEY}
    assert send(leaving, body, connection_id="conn-1") == {"statusCode": 200}
    assert leaving.events() == ["delta"]

    back = Connection()
    send(back, body, connection_id="conn-2")
    assert back.events() == ["committed"]
    assert back.final()["message"] == REPLY
    assert back.final()["success"] is True


@mock_aws
def test_the_authorizers_principal_owns_the_session(scripted):
    scripted([{"content": "Hello Ann"}, {"content": "Hello Bob"}])
    ann = Connection()
    send(ann, {"flowName": "TinyFlow", "message": "Hi"}, principal="ann")
    session = ann.final()["session"]
    bob = Connection()
    send(bob, {"flowName": "TinyFlow", "message": "Hi", "session": session}, principal="bob")
    # Someone else's session is as good as unknown: Bob's turn starts a session of his own.
    assert bob.final()["success"] is True
    assert bob.final()["session"] != session


@mock_aws
def test_connect_and_disconnect_are_accepted(scripted):
    scripted([])
    connection = Connection()
    for route, kind in (("$connect", "CONNECT"), ("$disconnect", "DISCONNECT")):
        event = {"requestContext": {"routeKey": route, "eventType": kind, "connectionId": "c"}}
        assert websocket.handle(event, Lambda(), connection.client) == {"statusCode": 200}
    assert connection.posts == []


@mock_aws
def test_a_model_failure_mid_stream_is_posted_as_aborted_without_its_details(scripted):
    scripted([{"content": "The red room", "error": "upstream 500 at https://models.internal", "status": 400,
               "break_after": 2}])
    connection = Connection()
    send(connection, {"flowName": "TinyFlow", "message": "Hi"})
    assert connection.events() == ["delta", "delta", "reset", "aborted"]
    assert connection.final()["code"] == "MODEL_UNAVAILABLE"
    assert "models.internal" not in json.dumps(connection.posts)


@mock_aws
def test_a_final_event_over_the_message_limit_arrives_in_parts_and_a_keyed_retry_gets_them_too(scripted):
    # Five long words: each delta fits in one message, the committed envelope (about 300 KB) does not.
    reply = " ".join(f'"{word}"' * 10_000 for word in "abcde")
    scripted([{"content": reply}])
    body = {"flowName": "TinyFlow", "message": "Everything, please", "idempotencyKey": KEY}
    connection = Connection()
    send(connection, body)
    assert connection.events().count("committed") == 1 and connection.events()[-1] == "committed"
    assert connection.final()["message"] == reply
    assert max(connection.sizes) <= 128 * 1024
    assert len(connection.sizes) > len(connection.posts)  # some events came in parts

    again = Connection()
    send(again, body, connection_id="conn-2")
    assert again.events() == ["committed"]
    assert again.final()["message"] == reply and len(again.sizes) > 1


@pytest.mark.parametrize("text", ['{"a": "' + '\\"' * 200_000 + '"}', json.dumps({"event": "x", "data": "y" * 500})])
def test_parts_fit_the_limit_whatever_they_escape_and_join_back(text):
    messages = websocket.messages(text, 7, limit=4096)
    assert all(len(message) <= 4096 for message in messages)
    joined = websocket.Reassembler()
    assert [joined.add(message) for message in messages][-1] == json.loads(text)


# -- the connect authorizer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def issuer(signing_key: rsa.RSAPrivateKey) -> Iterator[str]:
    """An OpenID issuer on a loopback port: its discovery document and its published keys."""
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    keys = {"keys": [{**public, "kid": "key-1", "use": "sig", "alg": "RS256"}]}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            base = f"http://127.0.0.1:{self.server.server_address[1]}"
            documents = {"/.well-known/openid-configuration": {"issuer": base, "jwks_uri": base + "/jwks.json"},
                         "/jwks.json": keys}
            body = json.dumps(documents.get(self.path, {})).encode()
            self.send_response(200 if self.path in documents else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "key-1"})


def connect_event(token: str | None = None) -> dict[str, Any]:
    """The authorizer's event for a browser's ``new WebSocket(url, ["picoflow", token])``."""
    headers = {"Sec-WebSocket-Protocol": f"picoflow, {token}" if token else "picoflow"}
    return {"type": "REQUEST", "methodArn": "arn:aws:execute-api:us-east-1:123:abc123/live/$connect",
            "queryStringParameters": {}, "headers": headers, "requestContext": {"routeKey": "$connect"}}


def test_a_valid_token_opens_the_connection_with_its_principal(issuer, signing_key, monkeypatch):
    monkeypatch.delenv("PICOFLOW_PRINCIPAL_CLAIM", raising=False)
    env = {"JWT_ISSUER": issuer, "JWT_AUDIENCE": "web,mobile"}
    good = token(signing_key, iss=issuer, aud="mobile", sub="user-42", exp=int(time.time()) + 300)
    answer = ws_authorizer.authorize(connect_event(token=good), env)
    assert answer["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    assert answer["context"] == {"principal": "user-42"}
    # A Cognito access token names its app client in client_id instead of aud.
    access = token(signing_key, iss=issuer, client_id="web", sub="user-7", exp=int(time.time()) + 300)
    assert ws_authorizer.authorize(connect_event(token=access), env)["context"] == {"principal": "user-7"}


@pytest.mark.parametrize("case", ["no token", "other audience", "expired", "other issuer", "forged", "no settings"])
def test_the_authorizer_refuses_what_the_http_api_would(issuer, signing_key, case):
    now = int(time.time())
    claims = {"iss": issuer, "aud": "web", "sub": "user-42", "exp": now + 300}
    key = signing_key
    env = {"JWT_ISSUER": issuer, "JWT_AUDIENCE": "web"}
    if case == "other audience":
        claims["aud"] = "someone-else"
    elif case == "expired":
        claims["exp"] = now - 60
    elif case == "other issuer":
        claims["iss"] = issuer + "/other"
    elif case == "forged":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif case == "no settings":
        env = {}
    answer = ws_authorizer.authorize(connect_event(None if case == "no token" else token(key, **claims)), env)
    assert answer["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    assert "context" not in answer


def test_the_authorizer_has_a_handler_of_its_own(issuer, signing_key, monkeypatch):
    monkeypatch.setenv("JWT_ISSUER", issuer)
    monkeypatch.setenv("JWT_AUDIENCE", "web")
    good = token(signing_key, iss=issuer, aud="web", sub="user-1", exp=int(time.time()) + 300)
    answer = handlers.websocket_authorizer.lambda_handler(connect_event(good), _LambdaContext())
    assert answer["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    assert answer["context"] == {"principal": "user-1"}


def test_a_token_in_the_url_is_not_accepted(issuer, signing_key):
    # Query strings reach access logs and proxies' logs: the token only travels as a subprotocol.
    good = token(signing_key, iss=issuer, aud="web", sub="user-1", exp=int(time.time()) + 300)
    event = connect_event()
    event["queryStringParameters"] = {"token": good}
    answer = ws_authorizer.authorize(event, {"JWT_ISSUER": issuer, "JWT_AUDIENCE": "web"})
    assert answer["policyDocument"]["Statement"][0]["Effect"] == "Deny"


@mock_aws
def test_connect_agrees_on_the_picoflow_subprotocol(scripted):
    scripted([])
    connection = Connection()
    event = {"requestContext": {"routeKey": "$connect", "eventType": "CONNECT", "connectionId": "c"},
             "headers": {"Sec-WebSocket-Protocol": "picoflow, eyJhbGciOi.x.y"}}
    answer = websocket.handle(event, Lambda(), connection.client)
    # Only the protocol name goes back, never the token.
    assert answer == {"statusCode": 200, "headers": {"Sec-WebSocket-Protocol": "picoflow"}}


class _LambdaContext(Lambda):
    function_name = "picoflow-websocket"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:picoflow-websocket"
    memory_limit_in_mb = 1024
    log_group_name = "/aws/lambda/picoflow-websocket"
    log_stream_name = "stream"


@mock_aws
def test_a_waiting_call_is_posted_and_decided_over_the_websocket(scripted, monkeypatch):
    from tests.support import desk_flows

    monkeypatch.setenv("PICOFLOW_FLOWS", desk_flows.__name__)
    desk_flows.APPLIED.clear()
    scripted([
        {"content": "Needs your approval.",
         "tool_calls": [{"name": "refund", "args": {"order": "A1", "amount": 250}, "id": "c1"}]},
        {"content": "Refunded."},
    ])
    first = Connection()
    send(first, {"flowName": "DeskFlow", "message": "refund A1"})
    [waiting] = first.final()["pendingApprovals"]
    assert waiting["tool"] == "refund" and desk_flows.APPLIED == []
    decided = Connection()
    send(decided, {"flowName": "DeskFlow", "session": first.final()["session"],
                   "approvals": [{"id": waiting["id"], "approved": True}]})
    assert decided.final()["message"] == "Refunded." and "pendingApprovals" not in decided.final()
    assert desk_flows.APPLIED == [("refund", {"order": "A1", "amount": 250.0})]
