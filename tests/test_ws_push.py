"""A reviewer's decision followed up on the owner's WebSocket: the HTTP and WebSocket handlers on moto (DynamoDB and
``apigatewaymanagementapi``), the model scripted.

The owner connects (the connection is recorded), their turn leaves a payout waiting for a reviewer, the reviewer
decides over ``POST /ai/approvals``: the model's follow-up is posted to the owner's connection once, as a WebSocket
turn's events; a retried decision posts nothing more; a gone connection gets nothing and the follow-up comes on the
owner's next turn; a slow follow-up does not hold the reviewer's answer past its budget.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

import handlers.api as api
from picoflow import Flow, ModelSelection, Step, direct, tool
from picoflow.aws import runtime as aws_runtime
from picoflow.aws import websocket, ws_push
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.aws.ws_connections import CONNECTION_ID_PREFIX, Connection, ConnectionBook, record_id
from picoflow.results import RunResponse
from tests.support import desk_flows
from tests.support.dynamodb_local import DynamoTable

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

ALICE = {"sub": "alice-1"}
REVIEWER = {"sub": "rita-3", "cognito:groups": "[support reviewers]"}
DOMAIN = "abc123.execute-api.us-east-1.amazonaws.com"
ENDPOINT = f"https://{DOMAIN}/live"
FOLLOW_UP = "Your goodwill credit of 250.00 is paid."
KEY = "3f1c2a4e-decision-1"


class CaseStep(Step):
    def get_prompt(self) -> str:
        return "Close cases."

    @tool(effect=True, approval="reviewer")
    async def close_case(self, args: desk_flows.Note) -> Any:
        """Close the case for good."""
        desk_flows.APPLIED.append(("close_case", args.model_dump()))
        return direct("Your case is closed.")


class CaseFlow(Flow):
    """A reviewer's approved call answered by its handler in code (a direct reply)."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="case", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [CaseStep(self)]


class Owner:
    """The owner's browser as ``apigatewaymanagementapi`` sees it (moto, with botocore's public
    ``provide-client-params`` event): posts are recorded and joined as a client joins ``part`` messages; once
    ``gone`` is set, ``GetConnection`` and ``PostToConnection`` answer ``GoneException``, as for a closed tab."""

    def __init__(self, connection_id: str = "alice-conn") -> None:
        self.connection_id = connection_id
        self.client = boto3.client("apigatewaymanagementapi", region_name="us-east-1", endpoint_url=ENDPOINT)
        self.posts: list[dict[str, Any]] = []
        self.gone = False
        self.joined = websocket.Reassembler()
        events = self.client.meta.events
        events.register("provide-client-params.apigatewaymanagementapi.PostToConnection", self._post)
        events.register("provide-client-params.apigatewaymanagementapi.GetConnection", self._check)

    def _gone(self, operation: str) -> Exception:
        error: Exception = self.client.exceptions.GoneException(
            {"Error": {"Code": "GoneException", "Message": "gone"}}, operation)
        return error

    def _check(self, params: dict[str, Any], **_: Any) -> None:
        if self.gone:
            raise self._gone("GetConnection")

    def _post(self, params: dict[str, Any], **_: Any) -> None:
        if self.gone:
            raise self._gone("PostToConnection")
        assert params["ConnectionId"] == self.connection_id
        event = self.joined.add(params["Data"].decode("utf-8"))
        if event is not None:
            self.posts.append(event)

    def events(self) -> list[str]:
        return [post["event"] for post in self.posts]

    def finals(self) -> list[dict[str, Any]]:
        return [post["data"] for post in self.posts if post["event"] in ("committed", "aborted")]


def ws_event(event_type: str, connection_id: str, principal: str | None, body: Any = None) -> dict[str, Any]:
    context: dict[str, Any] = {"routeKey": {"CONNECT": "$connect", "DISCONNECT": "$disconnect"}.get(event_type,
                                                                                                   "$default"),
                               "eventType": event_type, "connectionId": connection_id, "requestId": "r-1",
                               "domainName": DOMAIN, "stage": "live"}
    if principal is not None:
        context["authorizer"] = {"principalId": principal, "principal": principal}
    event: dict[str, Any] = {"requestContext": context}
    if body is not None:
        event["body"], event["isBase64Encoded"] = json.dumps(body), False
    return event


class Desk:
    """The two APIs of one deployment, sharing the container's runtime and a moto table."""

    def __init__(self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, table: DynamoTable) -> None:
        self.tmp_path, self.monkeypatch, self.table = tmp_path, monkeypatch, table
        self.owner = Owner()
        # The push builds its client from the recorded endpoint: hand it the owner's browser instead.
        monkeypatch.setattr(ws_push, "management_client", self._client_for)
        self.endpoints: list[str] = []

    def _client_for(self, endpoint: str) -> Any:
        self.endpoints.append(endpoint)
        return self.owner.client

    def script(self, *replies: dict[str, Any]) -> None:
        path = self.tmp_path / "script.json"
        path.write_text(json.dumps(list(replies)))
        self.monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        self.monkeypatch.setattr(aws_runtime, "_runtime", None)

    def connect(self, principal: str = "alice-1", connection_id: str = "alice-conn") -> None:
        websocket.handle(ws_event("CONNECT", connection_id, principal), FakeLambdaContext(), self.owner.client)

    def disconnect(self, principal: str = "alice-1", connection_id: str = "alice-conn") -> None:
        websocket.handle(ws_event("DISCONNECT", connection_id, principal), FakeLambdaContext(), self.owner.client)

    def say(self, body: dict[str, Any]) -> dict[str, Any]:
        """A WebSocket message of the owner's; its final event."""
        before = len(self.owner.posts)
        websocket.handle(ws_event("MESSAGE", "alice-conn", "alice-1", {"flowName": "DeskFlow", **body}),
                         FakeLambdaContext(), self.owner.client)
        finals = [post["data"] for post in self.owner.posts[before:] if post["event"] in ("committed", "aborted")]
        assert len(finals) == 1, self.owner.posts[before:]
        return finals[0]

    def decide(self, session: str, approval_id: str, *, key: str | None = KEY,
               context: FakeLambdaContext | None = None) -> tuple[int, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        event = http_event("POST", "/ai/approvals", body={"session": session, "id": approval_id, "approved": True},
                           headers=headers)
        event["requestContext"]["authorizer"] = {"jwt": {"claims": REVIEWER, "scopes": None}}
        result = api.lambda_handler(event, context or FakeLambdaContext())
        return result["statusCode"], json.loads(result["body"])

    def run(self, body: dict[str, Any], session: str) -> tuple[int, Any]:
        """An HTTP turn of the owner's."""
        event = http_event("POST", "/ai/run", body={"flowName": "DeskFlow", **body},
                           headers={"CHAT_SESSION_ID": session})
        event["requestContext"]["authorizer"] = {"jwt": {"claims": ALICE, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], json.loads(result["body"])

    def book(self) -> ConnectionBook:
        book = ConnectionBook.of(aws_runtime.get_runtime().engine.session_store)
        assert book is not None
        return book


@pytest.fixture
def desk(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Desk]:
    """The deployment on a moto table, or (``"dynamodb_local"``) on DynamoDB Local with moto emulating the rest."""
    with contextlib.ExitStack() as stack:
        if getattr(request, "param", "moto") == "dynamodb_local":
            table: DynamoTable = request.getfixturevalue("dynamodb_local_table")
            stack.enter_context(mock_aws(config={"core": {"passthrough": {"services": ["dynamodb"]}}}))
            monkeypatch.setenv("DYNAMODB_ENDPOINT_URL", str(table.endpoint_url))
        else:
            table = request.getfixturevalue("moto_dynamodb")
            monkeypatch.delenv("DYNAMODB_ENDPOINT_URL", raising=False)
        monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
        monkeypatch.setenv("SESSION_TABLE", table.name)
        monkeypatch.setenv("PICOFLOW_FLOWS", f"{desk_flows.__name__},{__name__}")
        monkeypatch.setenv("PICOFLOW_REVIEWER_GROUP", "reviewers")
        for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "PICOFLOW_PRINCIPAL_CLAIM"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        desk_flows.APPLIED.clear()
        yield Desk(tmp_path, monkeypatch, table)
        if aws_runtime._runtime is not None:
            aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


BOTH_STORES = pytest.mark.parametrize("desk", ["moto", "dynamodb_local"], indirect=True)


def payout() -> dict[str, Any]:
    return {"content": "A reviewer must approve that.",
            "tool_calls": [{"name": "payout", "args": {"order": "A1", "amount": 250}, "id": "c1"}]}


def waiting_payout(desk: Desk) -> tuple[str, str]:
    """The owner asks over the WebSocket; the session and the id of the payout left waiting for a reviewer."""
    final = desk.say({"message": "goodwill please"})
    [waiting] = final["pendingApprovals"]
    assert waiting["approver"] == "reviewer" and desk_flows.APPLIED == []
    return final["session"], waiting["id"]


@BOTH_STORES
def test_the_follow_up_is_pushed_once_to_the_owners_connection(desk: Desk) -> None:
    desk.script(payout(), {"content": FOLLOW_UP, "chunk_delay": 0.01}, {"content": "You are welcome."})
    desk.connect()
    session, approval = waiting_payout(desk)
    pushed_from = len(desk.owner.posts)

    status, decided = desk.decide(session, approval)
    assert status == 200 and decided["success"] and decided["message"] == ""
    assert desk_flows.APPLIED == [("payout", {"order": "A1", "amount": 250.0})]
    pushed = desk.owner.posts[pushed_from:]
    # Streamed like any WebSocket turn: the reply's text as it is written, then the committed envelope.
    assert [post["event"] for post in pushed].count("committed") == 1 and pushed[-1]["event"] == "committed"
    assert "".join(post["data"]["text"] for post in pushed if post["event"] == "delta") == FOLLOW_UP
    final = pushed[-1]["data"]
    assert final["session"] == session and final["message"] == FOLLOW_UP and "pendingApprovals" not in final
    assert desk.endpoints == [ENDPOINT]
    # On the table the deployment was given (DynamoDB Local's, in that case): the session and the owner's record.
    for item_id in (session, record_id("alice-1")):
        assert desk.table.client.get_item(TableName=desk.table.name, Key={"id": {"S": item_id}}).get("Item")

    # A retried decision, keyed or not, runs nothing and pushes nothing.
    assert desk.decide(session, approval) == (200, decided)
    status, again = desk.decide(session, approval, key=None)
    assert status == 409 and again["code"] == "APPROVAL_NOT_PENDING"
    assert len(desk.owner.posts) == pushed_from + len(pushed) and len(desk_flows.APPLIED) == 1

    # Pushed again for the same call, the follow-up turn replays under its key: nothing runs, nothing is posted.
    runtime = aws_runtime.get_runtime()
    stored = runtime.call(runtime.engine.session_store.load(session))
    assert stored is not None
    fresh = RunResponse(success=True, completed=False, message="", session=session)
    assert ws_push.push_follow_up(runtime, fresh, stored, approval, None) is False
    assert len(desk.owner.posts) == pushed_from + len(pushed)

    # The owner's next turn is answered afresh: the follow-up was the model's, once.
    assert desk.say({"message": "thanks", "session": session})["message"] == "You are welcome."


@BOTH_STORES
def test_a_gone_connection_gets_nothing_and_the_next_turn_brings_the_follow_up(desk: Desk) -> None:
    desk.script(payout(), {"content": FOLLOW_UP})
    desk.connect()
    session, approval = waiting_payout(desk)
    desk.owner.gone, posted = True, len(desk.owner.posts)

    status, decided = desk.decide(session, approval)
    assert status == 200 and decided["success"]
    assert len(desk.owner.posts) == posted
    # The gone connection is forgotten, so the next decision does not try it again.
    assert desk.book().find("alice-1") is None

    status, follow = desk.run({"message": "any news?"}, session)
    assert status == 200 and follow["message"] == FOLLOW_UP


def test_nobody_connected_means_no_push_and_the_next_turn_brings_the_follow_up(desk: Desk) -> None:
    desk.script(payout(), {"content": FOLLOW_UP})
    session, approval = waiting_payout(desk)
    posted = len(desk.owner.posts)
    status, _ = desk.decide(session, approval)
    assert status == 200 and len(desk.owner.posts) == posted and desk.endpoints == []
    assert desk.run({"message": "any news?"}, session)[1]["message"] == FOLLOW_UP


def test_a_connection_gone_mid_push_is_forgotten(desk: Desk) -> None:
    desk.script(payout(), {"content": FOLLOW_UP})
    desk.connect()
    session, approval = waiting_payout(desk)

    def leave(**_: Any) -> None:
        desk.owner.gone = True

    # The tab closes just after the check that it is open.
    desk.owner.client.meta.events.register("after-call.apigatewaymanagementapi.GetConnection", leave)
    status, _ = desk.decide(session, approval)
    assert status == 200 and desk.book().find("alice-1") is None


def test_a_slow_follow_up_does_not_hold_the_reviewers_answer(desk: Desk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ws_push, "FOLLOW_UP_SECONDS", 4.0)
    desk.script(payout(), {"content": "too late", "delay": 30}, {"content": FOLLOW_UP})
    desk.connect()
    session, approval = waiting_payout(desk)
    posted = len(desk.owner.posts)

    started = time.monotonic()
    status, decided = desk.decide(session, approval)
    assert status == 200 and decided["success"]
    assert time.monotonic() - started < 4.0 + 1.0
    # The cut-short follow-up committed nothing and posted nothing; the owner's next turn answers.
    assert len(desk.owner.posts) == posted
    assert desk.run({"message": "any news?"}, session)[1]["message"] == FOLLOW_UP


def test_no_follow_up_starts_without_time_for_it(desk: Desk) -> None:
    desk.script(payout(), {"content": FOLLOW_UP})
    desk.connect()
    session, approval = waiting_payout(desk)
    posted = len(desk.owner.posts)
    # Time for the decision, not for a follow-up after it.
    too_short = ws_push.MIN_FOLLOW_UP_SECONDS + ws_push.ANSWER_RESERVE_SECONDS - 0.3
    late = FakeLambdaContext(timeout_ms=int(too_short * 1000))
    status, _ = desk.decide(session, approval, context=late)
    assert status == 200 and len(desk.owner.posts) == posted
    assert desk.run({"message": "any news?"}, session)[1]["message"] == FOLLOW_UP


def test_a_direct_reply_to_the_decision_is_pushed_as_it_is(desk: Desk) -> None:
    desk.script({"content": "A reviewer must approve that.",
                 "tool_calls": [{"name": "close_case", "args": {"text": "A1"}, "id": "c1"}]})
    desk.connect()
    websocket.handle(ws_event("MESSAGE", "alice-conn", "alice-1", {"flowName": "CaseFlow", "message": "close it"}),
                     FakeLambdaContext(), desk.owner.client)
    final = desk.owner.finals()[-1]
    [waiting] = final["pendingApprovals"]
    status, decided = desk.decide(final["session"], waiting["id"])
    assert status == 200 and decided["message"] == "Your case is closed."
    assert desk.owner.events()[-1] == "committed"
    assert desk.owner.finals()[-1]["message"] == "Your case is closed." and len(desk.owner.finals()) == 2


def test_connect_and_disconnect_keep_the_owners_newest_connection(desk: Desk) -> None:
    desk.script()
    desk.connect(connection_id="tab-1")
    desk.connect(connection_id="tab-2")
    book = desk.book()
    assert book.find("alice-1") == Connection("tab-2", ENDPOINT)
    # The older tab closing leaves the newer one's record; the newer one closing removes it.
    desk.disconnect(connection_id="tab-1")
    assert book.find("alice-1") == Connection("tab-2", ENDPOINT)
    desk.disconnect(connection_id="tab-2")
    assert book.find("alice-1") is None
    # Anonymous connections are not recorded; the record's key names nobody.
    desk.connect(principal="", connection_id="anon")
    items = desk.table.client.scan(TableName=desk.table.name)["Items"]
    assert [item["id"]["S"] for item in items] == []
    desk.connect()
    [item] = desk.table.client.scan(TableName=desk.table.name)["Items"]
    assert item["id"]["S"] == record_id("alice-1") and item["id"]["S"].startswith(CONNECTION_ID_PREFIX)
    assert "alice-1" not in json.dumps(item) and int(item["expiresAt"]["N"]) > time.time() + 7000


def test_the_connection_book_on_dynamodb_local(dynamodb_local_table: DynamoTable) -> None:
    book = ConnectionBook(dynamodb_local_table.client, dynamodb_local_table.name)
    assert book.find("alice-1") is None
    book.remember("alice-1", Connection("tab-1", ENDPOINT))
    book.remember("alice-1", Connection("tab-2", ENDPOINT))
    book.remember("bob-2", Connection("tab-9", ENDPOINT))
    book.forget("alice-1", "tab-1")
    assert book.find("alice-1") == Connection("tab-2", ENDPOINT)
    book.forget("alice-1", "tab-2")
    assert book.find("alice-1") is None and book.find("bob-2") == Connection("tab-9", ENDPOINT)
    book.forget("alice-1", "tab-2")  # already gone: nothing to do


def test_erasing_the_owner_removes_their_connection_record(desk: Desk) -> None:
    desk.script()
    desk.connect()
    desk.connect(principal="bob-2", connection_id="bob-conn")
    event = http_event("DELETE", "/ai/me")
    event["requestContext"]["authorizer"] = {"jwt": {"claims": ALICE, "scopes": None}}
    assert api.lambda_handler(event, FakeLambdaContext())["statusCode"] == 200
    assert desk.book().find("alice-1") is None
    assert desk.book().find("bob-2") == Connection("bob-conn", ENDPOINT)


def test_a_record_that_cannot_be_written_does_not_refuse_the_connection(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    desk.script()

    def failing(*_: Any) -> None:
        raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}}, "PutItem")

    monkeypatch.setattr(ConnectionBook, "remember", failing)
    event = ws_event("CONNECT", "alice-conn", "alice-1")
    event["headers"] = {"Sec-WebSocket-Protocol": "picoflow, token"}
    answer = websocket.handle(event, FakeLambdaContext(), desk.owner.client)
    assert answer == {"statusCode": 200, "headers": {"Sec-WebSocket-Protocol": "picoflow"}}
    assert desk.book().find("alice-1") is None
