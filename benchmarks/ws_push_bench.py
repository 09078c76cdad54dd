"""A reviewer's decision pushed to the owner's WebSocket: what it adds to the reviewer's answer, and what it costs.

Run: .venv/bin/python benchmarks/ws_push_bench.py

Everything runs in this process on moto (DynamoDB and ``apigatewaymanagementapi``), through the real Lambda
handlers: the owner opens a WebSocket connection (``$connect``), asks for a payout over ``POST /ai/run`` (the model,
scripted, calls a tool that waits for a reviewer), and a reviewer approves it over ``POST /ai/approvals``. Rounds
alternate between the owner connected (the follow-up turn runs and is posted) and not connected (nothing is
pushed; the next turn would bring the follow-up). Measured per decision: the reviewer's answer time (wall clock of
the handler), the DynamoDB requests of the sessions table's client by operation, and the management API requests.
The scripted model answers at once, so the time is PicoFlow's and moto's, not a model's.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

import handlers.api as api  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from picoflow.aws import runtime as aws_runtime  # noqa: E402
from picoflow.aws import websocket, ws_push  # noqa: E402
from picoflow.aws.apigw import FakeLambdaContext, http_event  # noqa: E402
from tests.support import desk_flows  # noqa: E402
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, create_unique_table  # noqa: E402

TITLE = "Reviewer decisions pushed over the WebSocket API (ws_push_bench.py)"
COMMAND = ".venv/bin/python benchmarks/ws_push_bench.py"
ROUNDS = 40
WARM_UP = 4
OWNER = {"sub": "alice-1"}
REVIEWER = {"sub": "rita-3", "cognito:groups": "[reviewers]"}
DOMAIN = "abc123.execute-api.us-east-1.amazonaws.com"
PAYOUT = {"content": "A reviewer must approve that.",
          "tool_calls": [{"name": "payout", "args": {"order": "A1", "amount": 250}, "id": "c1"}]}
FOLLOW_UP = {"content": "Your goodwill credit of 250.00 is paid. Anything else I can do for you today?"}


def connected(round_index: int) -> bool:
    return round_index % 2 == 0


def ws_event(event_type: str) -> dict[str, Any]:
    return {"requestContext": {"eventType": event_type, "connectionId": "alice-conn", "requestId": "r",
                               "domainName": DOMAIN, "stage": "live",
                               "authorizer": {"principalId": "alice-1", "principal": "alice-1"}}}


def call(method: str, path: str, body: Any, claims: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    event = http_event(method, path, body=body, headers=headers or {})
    event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
    # The handler's metric documents go to stdout, as in Lambda: not this report's.
    with contextlib.redirect_stdout(io.StringIO()):
        answer = api.lambda_handler(event, FakeLambdaContext())
    if answer["statusCode"] != 200:
        raise RuntimeError(f"{path}: {answer['statusCode']} {answer['body'][:200]}")
    return json.loads(answer["body"])


def main() -> None:
    os.environ.update(DUMMY_AWS_ENV)
    logging.getLogger("picoflow").setLevel(logging.ERROR)
    dynamo: Counter[str] = Counter()
    management: Counter[str] = Counter()
    posted: list[int] = []
    answer_ms: dict[bool, list[float]] = {True: [], False: []}
    requests: dict[bool, Counter[str]] = {True: Counter(), False: Counter()}
    managed: Counter[str] = Counter()
    opened: Counter[str] = Counter()
    closed: Counter[str] = Counter()
    script = [reply for index in range(ROUNDS) for reply in ([PAYOUT, FOLLOW_UP] if connected(index) else [PAYOUT])]
    build = ws_push.management_client

    def counted_client(endpoint: str) -> Any:
        client = build(endpoint)
        client.meta.events.register("provide-client-params.apigatewaymanagementapi.*",
                                    lambda model, **_: management.update([model.name]))
        client.meta.events.register("provide-client-params.apigatewaymanagementapi.PostToConnection",
                                    lambda params, **_: posted.append(len(params["Data"])))
        return client

    ws_push.management_client = counted_client
    with tempfile.TemporaryDirectory() as scratch, mock_aws():
        path = Path(scratch) / "script.json"
        path.write_text(json.dumps(script), encoding="utf-8")
        table = create_unique_table(boto3.client("dynamodb", region_name=REGION), None)
        os.environ.update({"SESSION_STORE": "DYNAMODB", "SESSION_TABLE": table.name, "PICOFLOW_SCRIPT": str(path),
                           "PICOFLOW_FLOWS": desk_flows.__name__, "PICOFLOW_REVIEWER_GROUP": "reviewers"})
        aws_runtime.reset_runtime()
        aws_runtime.get_runtime().engine.session_store.client.meta.events.register(
            "provide-client-params.dynamodb.*", lambda model, **_: dynamo.update([model.name]))
        websocket_client = boto3.client("apigatewaymanagementapi", region_name=REGION,
                                        endpoint_url=f"https://{DOMAIN}/live")
        for index in range(ROUNDS):
            if connected(index):
                dynamo.clear()
                websocket.handle(ws_event("CONNECT"), FakeLambdaContext(), websocket_client)
                opened.update(dynamo) if index >= WARM_UP else None
            asked = call("POST", "/ai/run", {"flowName": "DeskFlow", "message": "goodwill please"}, OWNER)
            [waiting] = asked["pendingApprovals"]
            dynamo.clear()
            management.clear()
            started = time.perf_counter()
            call("POST", "/ai/approvals", {"session": asked["session"], "id": waiting["id"], "approved": True},
                 REVIEWER, {"Idempotency-Key": f"decision-{index}"})
            elapsed = (time.perf_counter() - started) * 1000
            if index >= WARM_UP:
                answer_ms[connected(index)].append(elapsed)
                requests[connected(index)].update(dynamo)
                managed.update(management)
            if connected(index):
                dynamo.clear()
                websocket.handle(ws_event("DISCONNECT"), FakeLambdaContext(), websocket_client)
                closed.update(dynamo) if index >= WARM_UP else None
        aws_runtime.reset_runtime()
    ws_push.management_client = build
    write_section(TITLE, COMMAND, report(answer_ms, requests, managed, opened, closed, posted))


def report(answer_ms: dict[bool, list[float]], requests: dict[bool, Counter[str]], managed: Counter[str],
           opened: Counter[str], closed: Counter[str], posted: list[int]) -> str:
    def per(counter: Counter[str], count: int) -> str:
        return ", ".join(f"{name} {value / count:g}" for name, value in sorted(counter.items())) or "none"

    def p95(values: list[float]) -> float:
        return sorted(values)[max(0, round(0.95 * len(values)) - 1)]

    pushes = len(answer_ms[True])
    rows = []
    for mode, label in ((False, "owner not connected: nothing pushed"),
                        (True, "owner connected: follow-up run and posted")):
        values = answer_ms[mode]
        rows.append(f"| {label} | {len(values)} | {statistics.median(values):.1f} | {p95(values):.1f} | "
                    f"{per(requests[mode], len(values))} |")
    return f"""Rounds alternate between the owner connected and not; {WARM_UP} warm-up rounds are left out. The
owner's turn leaves a payout waiting for a reviewer; the reviewer's `POST /ai/approvals` runs it (moto DynamoDB,
the model scripted and instant). The answer time is the handler's wall clock; requests are those of the sessions
table's client during the decision, per decision. Both rows include the `GetItem` that looks the owner's
connection up; the connected row adds the follow-up turn (its session read, receipt check and write).

| decision | decisions | reviewer's answer p50 (ms) | p95 (ms) | DynamoDB requests per decision |
|---|---:|---:|---:|---|
{chr(10).join(rows)}

Per pushed follow-up, `apigatewaymanagementapi`: {per(managed, pushes)} (the check that the connection is
open, then one post per event of the turn), {sum(posted) / max(pushes, 1):.0f} bytes posted in all.
Keeping the record: `$connect` {per(opened, pushes)}; `$disconnect` {per(closed, pushes)}; a turn none.

The push is bounded: at most `FOLLOW_UP_SECONDS` ({ws_push.FOLLOW_UP_SECONDS:g} s) of the reviewer's answer,
and never past the invocation's time less `ANSWER_RESERVE_SECONDS` ({ws_push.ANSWER_RESERVE_SECONDS:g} s). With
a real model, the connected row adds the model's own reply time."""


if __name__ == "__main__":
    main()
