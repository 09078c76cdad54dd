"""Approvals over the HTTP API: through the Lambda handler with API Gateway events on moto, the model scripted.

The user sees ``pendingApprovals`` and decides with ``approvals`` on ``POST /ai/run``; a reviewer (a JWT carrying
the ``PICOFLOW_REVIEWER_GROUP`` group) lists waiting calls with ``GET /ai/approvals`` and decides one with
``POST /ai/approvals``; nobody else can.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import handlers.api as api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.api import openapi_schema
from picoflow.aws.apigw import FakeLambdaContext, http_event
from tests.support import desk_flows

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

ALICE = {"sub": "alice-1"}
MALLORY = {"sub": "mallory-2"}
REVIEWER = {"sub": "rita-3", "cognito:groups": "[support reviewers]"}
NOT_A_REVIEWER = {"sub": "sam-4", "cognito:groups": "[support]"}


class Api:
    def __init__(self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch

    def script(self, *replies: dict[str, Any]) -> None:
        path = self.tmp_path / "script.json"
        path.write_text(json.dumps(list(replies)))
        self.monkeypatch.setenv("PICOFLOW_SCRIPT", str(path))
        self.monkeypatch.setattr(aws_runtime, "_runtime", None)

    def call(self, method: str, path: str, body: Any = None, *, session: str | None = None,
             claims: dict[str, Any] | None = None, key: str | None = None) -> tuple[int, Any]:
        headers = {"CHAT_SESSION_ID": session} if session else {}
        if key:
            headers["Idempotency-Key"] = key
        event = http_event(method, path, body=body, headers=headers)
        if claims is not None:
            event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
        result = api.lambda_handler(event, FakeLambdaContext())
        return result["statusCode"], json.loads(result["body"])

    def run(self, body: dict[str, Any], **kwargs: Any) -> tuple[int, Any]:
        return self.call("POST", "/ai/run", {"flowName": "DeskFlow", **body}, **kwargs)


@pytest.fixture
def http(moto_dynamodb: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", desk_flows.__name__)
    monkeypatch.setenv("PICOFLOW_REVIEWER_GROUP", "reviewers")
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "PICOFLOW_PRINCIPAL_CLAIM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    desk_flows.APPLIED.clear()
    yield Api(tmp_path, monkeypatch)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def refund(amount: float = 250, name: str = "refund") -> dict[str, Any]:
    return {"content": "It needs a decision.",
            "tool_calls": [{"name": name, "args": {"order": "A1", "amount": amount}, "id": "c1"}]}


def test_the_user_sees_and_decides_a_waiting_call(http: Api) -> None:
    http.script(refund(), {"content": "Refunded, thank you."})
    status, body = http.run({"message": "refund A1"}, claims=ALICE)
    assert status == 200 and body["message"] == "It needs a decision."
    [waiting] = body["pendingApprovals"]
    assert set(waiting) == {"id", "tool", "arguments", "step", "approver", "expiresAt"}
    assert waiting["arguments"] == {"order": "A1", "amount": 250.0} and waiting["approver"] == "user"
    session = body["session"]

    # Another principal cannot decide it, and a client cannot smuggle other arguments in.
    status, foreign = http.run({"approvals": [{"id": waiting["id"], "approved": True}]}, session=session,
                               claims=MALLORY)
    assert status == 409 and foreign["code"] == "APPROVAL_NOT_PENDING"
    status, refused = http.run({"approvals": [{"id": waiting["id"], "approved": True, "arguments": {"amount": 1}}]},
                               session=session, claims=ALICE)
    assert status == 400 and desk_flows.APPLIED == []

    status, decided = http.run({"approvals": [{"id": waiting["id"], "approved": True}]}, session=session,
                               claims=ALICE)
    assert status == 200 and decided["message"] == "Refunded, thank you." and "pendingApprovals" not in decided
    assert desk_flows.APPLIED == [("refund", {"order": "A1", "amount": 250.0})]
    status, again = http.run({"approvals": [{"id": waiting["id"], "approved": True}]}, session=session,
                             claims=ALICE)
    assert status == 409 and again["code"] == "APPROVAL_NOT_PENDING"
    assert again["message"] == "No such call is waiting for a decision: it is unknown, expired or already decided."


def test_a_reviewer_lists_and_decides_and_others_cannot(http: Api) -> None:
    http.script(refund(name="payout"), {"content": "Your credit is paid."})
    _, body = http.run({"message": "goodwill please"}, claims=ALICE)
    session, waiting = body["session"], body["pendingApprovals"][0]
    assert waiting["approver"] == "reviewer"

    # The user may not decide it; nobody outside the reviewer group may list or decide.
    status, mine = http.run({"approvals": [{"id": waiting["id"], "approved": True}]}, session=session, claims=ALICE)
    assert status == 403 and mine["code"] == "NOT_APPROVER"
    for claims in (None, ALICE, NOT_A_REVIEWER):
        status, listed = http.call("GET", "/ai/approvals", claims=claims)
        assert status == 403 and listed["code"] == "NOT_APPROVER"
        status, _ = http.call("POST", "/ai/approvals", {"session": session, "id": waiting["id"], "approved": True},
                              claims=claims)
        assert status == 403
    assert desk_flows.APPLIED == []

    status, listed = http.call("GET", "/ai/approvals", claims=REVIEWER)
    assert status == 200
    [entry] = listed["approvals"]
    assert (entry["session"], entry["flowName"], entry["tool"]) == (session, "DeskFlow", "payout")

    status, decided = http.call("POST", "/ai/approvals",
                                {"session": session, "id": waiting["id"], "approved": True, "reason": "loyal"},
                                claims=REVIEWER)
    assert status == 200 and decided["success"]
    assert desk_flows.APPLIED == [("payout", {"order": "A1", "amount": 250.0})]
    assert http.call("GET", "/ai/approvals", claims=REVIEWER)[1]["approvals"] == []
    status, twice = http.call("POST", "/ai/approvals", {"session": session, "id": waiting["id"], "approved": True},
                              claims=REVIEWER)
    assert status == 409 and twice["code"] == "APPROVAL_NOT_PENDING"

    # The user's next turn hears the model's follow-up, which read the payout's result.
    status, follow = http.run({"message": "any news?"}, session=session, claims=ALICE)
    assert status == 200 and follow["message"] == "Your credit is paid."


def test_a_reviewer_of_their_own_session_is_refused(http: Api) -> None:
    http.script(refund(name="payout"))
    _, body = http.run({"message": "goodwill please"}, claims=REVIEWER)
    status, own = http.call("POST", "/ai/approvals",
                            {"session": body["session"], "id": body["pendingApprovals"][0]["id"], "approved": True},
                            claims=REVIEWER)
    assert status == 403 and own["code"] == "NOT_APPROVER" and desk_flows.APPLIED == []


def test_without_a_reviewer_group_nobody_reviews(http: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PICOFLOW_REVIEWER_GROUP")
    status, body = http.call("GET", "/ai/approvals", claims=REVIEWER)
    assert status == 403 and body["code"] == "NOT_APPROVER"


@pytest.mark.parametrize("decisions", [
    [{"id": "x"}], [{"id": "", "approved": True}], [{"id": "x", "approved": "yes"}],
    [{"id": "x", "approved": True, "reason": "r" * 501}], "approve",
])
def test_malformed_decisions_are_refused(http: Api, decisions: Any) -> None:
    status, body = http.run({"approvals": decisions})
    assert status == 400 and body["success"] is False


def test_the_openapi_document_lists_the_approval_routes() -> None:
    paths = openapi_schema()["paths"]
    assert {"post", "get"} <= set(paths["/ai/approvals"])
    run = json.dumps(paths["/ai/run"])
    assert "APPROVAL_NOT_PENDING" in run and "NOT_APPROVER" in run
