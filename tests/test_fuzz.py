"""Fuzzing the real Lambda handler with requests drawn from its own OpenAPI document, bent out of shape.

Every response must be below 500, carry the JSON envelope (or, for a step with another content type, its
raw message), echo only well-formed session ids, and a refused request must leave the sessions table as
it was. Runs on moto with a scripted model; the example counts are bounded to keep the file well under a
minute.
"""

import base64
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import handlers.api as api
from picoflow import wire
from picoflow.aws import api as aws_api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from tests.support import echo_flows
from tests.support.dynamodb_local import DynamoTable

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

FLOWS = ("EchoFlow", "JsonFlow")
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
SUCCESS_KEYS = {"success", "completed", "message", "session", "contentType"}
FAILURE_KEYS = {"success", "completed", "message", "session", "code", "requestId"}
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


# -- strategies from the OpenAPI document ----------------------------------------------------------

SCHEMA = aws_api.openapi_schema()
RUN = SCHEMA["paths"]["/ai/run"]["post"]
BODY_REF = RUN["requestBody"]["content"]["application/json"]["schema"]["$ref"]
BODY_SCHEMA = SCHEMA["components"]["schemas"][BODY_REF.rsplit("/", 1)[-1]]
# Powertools publishes header parameters under their lower-cased names (header names are case-insensitive).
HEADER_SCHEMAS = {parameter["name"]: parameter["schema"] for parameter in RUN["parameters"]}
SESSION_PARAMETER, IDEMPOTENCY_PARAMETER = wire.SESSION_HEADER.lower(), wire.IDEMPOTENCY_HEADER.lower()

LONE_SURROGATES = ["\ud800", "\udfff", "a\udc00b"]
ODD_TEXT = [
    "",
    " ",
    "\x00",
    "nul\x00inside",
    "\u202eevil\u202c",  # right-to-left override
    "\u200f\u200e\u200b",  # RTL/LTR marks, zero-width space
    "\ufeffbom",
    "e\u0301\u0301\u0301",
    "😀👨‍👩‍👧",
    "../../etc/passwd",
    "<script>alert(1)</script>",
    "' OR 1=1 --",
    "${jndi:ldap://x}",
    "{{7*7}}",
    "line\r\nX-Injected: yes",
    *LONE_SURROGATES,
]
HOSTILE_KEYS = ["__proto__", "constructor", "prototype", "__class__", "", "$where", "a.b", "\x00"]


def huge_text(low: int, high: int) -> st.SearchStrategy[str]:
    return st.builds(lambda unit, count: unit * count, st.sampled_from(["A", "é", "😀", "\u202e", "\x00"]),
                     st.integers(low, high))


odd_text = st.sampled_from(ODD_TEXT) | st.text(max_size=40) | huge_text(1_000, 120_000)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | odd_text
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(HOSTILE_KEYS) | st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that satisfy ``schema`` (the subset of JSON Schema the API's document uses)."""
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    if "$ref" in schema:
        return from_schema(SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 200), 200))
    if kind == "array":
        return st.lists(from_schema(schema["items"]), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object" and "properties" in schema:
        required = {name: from_schema(schema["properties"][name]) for name in schema.get("required", [])}
        optional = {name: from_schema(s) for name, s in schema["properties"].items() if name not in required}
        return st.fixed_dictionaries(required, optional=optional)
    if kind == "object":
        return st.dictionaries(st.sampled_from(HOSTILE_KEYS) | st.text(max_size=8), json_values, max_size=5)
    raise AssertionError(f"the fuzzer does not cover schema {schema}")


def bent(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly values of ``schema``; otherwise wrong types and hostile text."""
    return st.one_of(from_schema(schema), from_schema(schema), json_values)


@st.composite
def run_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for name, schema in BODY_SCHEMA["properties"].items():
        if name == "flowName":
            value = draw(st.sampled_from(FLOWS) | st.sampled_from(FLOWS) | bent(schema) | st.sampled_from(HOSTILE_KEYS))
        else:
            value = draw(bent(schema))
        if name in BODY_SCHEMA["required"] or draw(st.booleans()):
            body[name] = value
    for key in draw(st.lists(st.sampled_from(HOSTILE_KEYS), max_size=3)):
        body[key] = draw(json_values)
    return body


@st.composite
def session_ids(draw: st.DrawFn) -> str:
    good = from_schema(HEADER_SCHEMAS[SESSION_PARAMETER])
    bad = st.sampled_from(["", "../x", "a/b", "a b", "ａｂｃ", "séance", "a" * 129, "x\n", "%2e%2e", "abc,def"])
    return draw(good | bad | odd_text)


@st.composite
def idempotency_keys(draw: st.DrawFn) -> str:
    good = from_schema(HEADER_SCHEMAS[IDEMPOTENCY_PARAMETER])
    # A few fixed keys make replays and mismatches happen across examples.
    reused = st.sampled_from(["retry-1", "retry-2"])
    return draw(good | reused | st.sampled_from(["~" * 257, "ключ", "\t", ""]) | odd_text)


@st.composite
def headers(draw: st.DrawFn, pool: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    if draw(st.booleans()):
        name = draw(st.sampled_from([wire.SESSION_HEADER, "chat_session_id", "Chat-Session-Id"]))
        pairs.append((name, draw(st.sampled_from(pool) | session_ids() if pool else session_ids())))
    if draw(st.booleans()):
        pairs.append((wire.IDEMPOTENCY_HEADER, draw(idempotency_keys())))
    if draw(st.booleans()):
        # Repeated headers reach the function joined with commas, as API Gateway joins them.
        pairs.extend(draw(st.lists(st.tuples(
            st.sampled_from([wire.SESSION_HEADER, wire.IDEMPOTENCY_HEADER, "content-type", "x-odd", "authorization"]),
            odd_text | st.text(max_size=20),
        ), max_size=4)))
    if draw(st.booleans()):
        pairs.append(("x-huge", draw(huge_text(8_000, 20_000))))
    return pairs


def encoded(body: Any) -> st.SearchStrategy[str | bytes]:
    """The body as JSON text: lone surrogates survive only as escapes, so they force ``ensure_ascii``."""
    escaped = json.dumps(body)
    try:
        raw = json.dumps(body, ensure_ascii=False)
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return st.just(escaped)
    return st.sampled_from([escaped, raw, raw.encode("utf-8")])


malformed_bodies = st.sampled_from([
    "",
    "{",
    "[1, 2]",
    '"text"',
    "null",
    '{"flowName": }',
    '{"flowName": "EchoFlow",}',
    '{"flowName": "EchoFlow", "message": "\\ud800"}',
    '{"flowName": "EchoFlow", "flowName": 3}',
    '{"flowName": "EchoFlow", "config": {"a": NaN, "b": Infinity}}',
    '{"flowName": "EchoFlow", "config": {"n": ' + "9" * 5000 + "}}",
    '{"flowName": "EchoFlow", "config": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"flowName": "EchoFlow", "config": {"a": ' + "[" * 40 + "]" * 40 + "}}",
]) | st.text(max_size=200) | st.binary(max_size=200)


# -- the harness -----------------------------------------------------------------------------------


@dataclass
class Harness:
    table: DynamoTable
    #: Sessions created before the examples run; examples continue them, never delete them.
    pool: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    #: The Lambda request id of the last request, which a failure envelope carries as ``requestId``.
    last_request_id: str = ""

    def count(self, table: str) -> int:
        return self.table.client.scan(TableName=table, Select="COUNT", ConsistentRead=True)["Count"]

    def send(self, method: str, path: str, body: Any, header_pairs: list[tuple[str, str]]) -> tuple[int, dict, str]:
        if isinstance(body, bytes):
            header_pairs = [*header_pairs, ("content-type", "application/octet-stream")]
        event = http_event(method, path, body=body, headers=header_pairs)
        context = FakeLambdaContext()
        self.last_request_id = context.aws_request_id
        result = api.lambda_handler(event, context)
        self.statuses[result["statusCode"]] += 1
        response_headers = {k.lower(): v for k, v in result.get("headers", {}).items()}
        raw = result.get("body") or ""
        if result.get("isBase64Encoded"):
            raw = base64.b64decode(raw).decode("utf-8")
        return result["statusCode"], response_headers, raw

    def check(self, method: str, path: str, body: Any, header_pairs: list[tuple[str, str]]) -> None:
        sessions_before = self.count(self.table.name)
        status, response_headers, raw = self.send(method, path, body, header_pairs)
        assert status < 500, raw
        if "chat_session_id" in response_headers:
            assert SESSION_ID.fullmatch(response_headers["chat_session_id"])
        flow = _flow_name(body)
        if (method, path, status, flow) == ("POST", "/ai/run", 200, "JsonFlow"):
            # A non-plain step answers with its raw message and only the header names the session.
            assert response_headers["content-type"] == "application/json"
            assert SESSION_ID.fullmatch(response_headers["chat_session_id"])
            json.loads(raw)
            return
        assert response_headers["content-type"] == "application/json"
        payload = json.loads(raw)
        if isinstance(payload, dict) and "code" in payload:
            self.codes[payload["code"]] += 1
        if (method, path) == ("GET", "/ai/flows"):
            assert payload == list(FLOWS)
        elif (method, path) == ("GET", "/health"):
            assert payload == {"status": "ok"}
        elif (method, path) == ("POST", "/ai/end"):
            assert payload["success"] is (status == 200)
            assert payload["session"] == "" or SESSION_ID.fullmatch(payload["session"])
        else:
            assert set(payload) == (SUCCESS_KEYS if status == 200 else FAILURE_KEYS)
            assert payload["success"] is (status == 200)
            if status != 200:
                assert payload["requestId"] == self.last_request_id
            assert payload["session"] == "" or SESSION_ID.fullmatch(payload["session"])
        if status >= 400:
            assert self.count(self.table.name) == sessions_before, f"{status} {raw[:200]}"


def _flow_name(body: Any) -> Any:
    try:
        return json.loads(body).get("flowName")
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None


@pytest.fixture
def harness(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Harness]:
    script = tmp_path / "script.json"
    # JSON text serves both flows: the JSON step returns it raw, the plain one inside the envelope.
    script.write_text(json.dumps([{"content": json.dumps({"reply": n})} for n in range(2000)]))
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    harness = Harness(moto_dynamodb)
    for flow in FLOWS:
        # Sessions the examples can continue (or try to hijack with the other flow).
        _, response_headers, _ = harness.send("POST", "/ai/run", {"flowName": flow, "message": "seed"}, [])
        harness.pool.append(response_headers["chat_session_id"])
    harness.statuses.clear()
    yield harness
    print(f"responses by status: {dict(sorted(harness.statuses.items()))}; failure codes: {dict(harness.codes)}")
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def test_the_schema_describes_the_run_contract():
    assert set(SCHEMA["paths"]) == {"/ai/run", "/ai/files", "/ai/end", "/ai/flows", "/health", "/ai/me"}
    assert BODY_SCHEMA["required"] == ["flowName"]
    assert set(HEADER_SCHEMAS) == {SESSION_PARAMETER, IDEMPOTENCY_PARAMETER}
    assert "/swagger" not in SCHEMA["paths"]


def test_named_hostile_requests(harness):
    for body, pairs in NAMED_CASES:
        harness.check("POST", "/ai/run", body, pairs)
    assert sum(harness.statuses.values()) == len(NAMED_CASES)


@FUZZ
@given(data=st.data())
def test_run_requests_from_the_schema(harness, data):
    body = data.draw(run_bodies())
    raw = data.draw(st.one_of(encoded(body), encoded(body), encoded(body), malformed_bodies))
    harness.check("POST", "/ai/run", raw, data.draw(headers(harness.pool)))


ROUTES = [(method, path) for path, item in SCHEMA["paths"].items() for method in map(str.upper, item)]
odd_routes = st.tuples(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    st.sampled_from(["/ai/run", "/ai/end", "/", "/ai/run/", "//ai/run", "/swagger", "/ai/../health"])
    | st.text(max_size=30).map(lambda tail: "/" + tail),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES) | odd_routes, body=st.none() | malformed_bodies, data=st.data())
def test_any_route_any_method(harness, route, body, data):
    method, path = route
    pairs = data.draw(headers([]))
    if (method, path) == ("POST", "/ai/end"):
        # Only generated ids, so the examples cannot delete one another's sessions.
        pairs = [(name, value) for name, value in pairs if name.lower() not in wire.SESSION_HEADER_SPELLINGS]
    harness.check(method, path, body, pairs)


NAMED_CASES: list[tuple[Any, list[tuple[str, str]]]] = [
    *[
        (json.dumps({"flowName": "EchoFlow", "message": text}), [])
        for text in ["\ud800", "a\udfffb", "\u202eevil", "\u200f", "nul\x00", "A" * 100_001]
    ],
    (json.dumps({"flowName": "EchoFlow", "config": {"k": "\udc00"}}), []),
    (json.dumps({"flowName": "EchoFlow", "config": {"__proto__": {"admin": True}, "constructor": {"prototype": 1}}}),
     []),
    (json.dumps({"flowName": "__proto__", "message": "hi"}), []),
    (json.dumps({"flowName": "constructor", "prototype": {"x": 1}, "__proto__": None}), []),
    *[
        (json.dumps({"flowName": "EchoFlow", "message": "hi"}), [(wire.SESSION_HEADER, session)])
        for session in ["a" * 129, "../../etc/passwd", "séance", "ｓｅｓｓｉｏｎ", "", " ", "a\r\nX-Injected: 1", "a,b"]
    ],
    (json.dumps({"flowName": "EchoFlow"}), [(wire.SESSION_HEADER, "abc"), (wire.SESSION_HEADER, "def")]),
    (json.dumps({"flowName": "EchoFlow"}), [(wire.IDEMPOTENCY_HEADER, "a"), (wire.IDEMPOTENCY_HEADER, "b")]),
    (json.dumps({"flowName": "EchoFlow"}), [(wire.IDEMPOTENCY_HEADER, "k" * 257)]),
    (json.dumps({"flowName": "EchoFlow"}), [("x-huge", "h" * 64_000)]),
    (b"\xff\xfe\x00garbage", []),
    ('{"flowName": "EchoFlow", "config": ' + "[" * 100_000 + "]" * 100_000 + "}", []),
    ('{"flowName": "EchoFlow", "config": {"a": ' + "[" * 900 + "]" * 900 + "}}", []),
]
