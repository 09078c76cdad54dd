"""The effect-timing proofs: a refund turn fails at each point of its life, the client retries, and a payments
service outside the framework counts the refunds that were applied.

Each attempt of the turn runs in a process of its own (``effect_worker``, forked from a fork server that has
imported the framework) against DynamoDB Local, as Lambda containers would; a crash is a SIGKILL at the chosen
point, and nothing of a process survives it but what it wrote to DynamoDB and the payments service. The
payments service (``PaymentsServer``) either honours the ``Idempotency-Key`` the refund tool sends
(``tool_idempotency_key()``) or ignores it. The client retries until the turn is answered: with its own
``Idempotency-Key`` on every attempt (as the turn contract advises), or without one, by session id only.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.dynamodb_store import DynamoDBSessionStore
from tests.support.dynamodb_local import REGION
from tests.support.effect_flows import ApprovedRefundFlow, RefundFlow
from tests.support.effect_worker import run_attempt
from tests.support.payments_server import PaymentsServer

MESSAGE = "Please refund order A1 (25 USD)."
#: Bounds each attempt's process (imports included).
ATTEMPT_TIMEOUT_SECONDS = 120
#: The turn deadline of the deadline timing, and the model's delay that outlasts it.
DEADLINE_SECONDS = 3.0
#: Each timing: its name, what happens, and the points where the first attempt fails.
TIMINGS: list[tuple[str, str]] = [
    ("before_handler", "crash before the handler runs"),
    ("after_downstream", "crash inside the handler, after the payments call"),
    ("before_journal", "crash after the handler returned, before the journal write"),
    ("before_turn_write", "crash after the journal write, before the session write"),
    ("before_answer", "crash after the session write, before the answer"),
    ("model_outage", "the model call after the tool fails (502)"),
    ("deadline", "the turn deadline passes in the model call after the tool (504)"),
    ("conflict", "409: the client's retry replays the tool, then loses the write to the first attempt"),
]
#: The two windows between the downstream call and the journal write.
WINDOWS = ("after_downstream", "before_journal")
CRASHES = ("before_handler", "after_downstream", "before_journal", "before_turn_write", "before_answer")
# Attempts fork from a server that imported the worker once: a real process each, started in milliseconds.
_PROCESSES = multiprocessing.get_context("forkserver")
_PROCESSES.set_forkserver_preload(["tests.support.effect_worker"])


@dataclass
class Row:
    """One timing: the refunds applied for each client (keyed or keyless) and payments service behaviour."""

    timing: str
    what: str
    keyed_honoured: int = 0
    keyed_ignored: int = 0
    keyless_honoured: int = 0
    keyless_ignored: int = 0


def refund_call(call_id: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "refund", "args": {"order": "A1", "amount": 25}, "id": call_id}]}


def answer(text: str, delay: float = 0) -> dict[str, Any]:
    return {"content": text, **({"delay": delay} if delay else {})}


class Client:
    """Runs attempts of one refund turn, each in a new process, against one table and one payments service."""

    def __init__(self, endpoint: str, table: str, payments: str, keyed: bool, workdir: Path) -> None:
        self.endpoint, self.table, self.payments, self.workdir = endpoint, table, payments, workdir
        self.key = uuid.uuid4().hex if keyed else None
        self.session = asyncio.run(self._open())

    async def _open(self) -> str:
        store = DynamoDBSessionStore(self.table, endpoint_url=self.endpoint, region_name=REGION)
        engine = FlowEngine([RefundFlow], store, ProviderRegistry(override=ScriptedProvider([answer("Hello.")])))
        response = await engine.run("RefundFlow", "hi")
        await engine.close()
        assert response.success, response.message
        return response.session

    def start(self, script: list[dict[str, Any]], **task: Any) -> tuple[Any, Path]:
        spec = {"endpoint": self.endpoint, "table": self.table, "session": self.session, "message": MESSAGE,
                "key": self.key, "script": script, "payments": self.payments, **task}
        answer_path = self.workdir / f"answer-{uuid.uuid4().hex}.json"
        process = _PROCESSES.Process(target=run_attempt, args=(spec, str(answer_path)))
        process.start()
        return process, answer_path

    def finish(self, started: tuple[Any, Path]) -> dict[str, Any] | None:
        """The attempt's answer, or None when it crashed (no answer reached the client)."""
        process, answer_path = started
        process.join(ATTEMPT_TIMEOUT_SECONDS)
        if process.is_alive():
            process.kill()
            raise AssertionError("an attempt did not finish in time")
        return json.loads(answer_path.read_text()) if process.exitcode == 0 and answer_path.exists() else None

    def run(self, script: list[dict[str, Any]], **task: Any) -> dict[str, Any] | None:
        return self.finish(self.start(script, **task))

    def retry_until_answered(self, tag: str) -> dict[str, Any]:
        """Re-send the turn (the model gives its calls new ids) until it is answered with success."""
        for attempt in range(3):
            reply = self.run([refund_call(f"{tag}-{attempt}"), answer("Refunded.")])
            if reply is not None and reply["status"] == 200:
                return reply
        raise AssertionError(f"the turn was not answered after retries: {reply}")


def run_timing(endpoint: str, table: str, timing: str, *, keyed: bool, honour: bool) -> int:
    """Refunds applied when the first attempt of the turn fails at ``timing`` and the client retries."""
    with PaymentsServer(honour_keys=honour) as payments, tempfile.TemporaryDirectory() as folder:
        client = Client(endpoint, table, payments.url, keyed, Path(folder))
        first = [refund_call("first")]
        if timing in CRASHES:
            reply = client.run([*first, answer("Refunded.")], crash=timing)
            assert reply is None, f"{timing}: the attempt should have crashed"
        elif timing == "model_outage":
            reply = client.run([*first, {"error": "model down", "status": 400}])
            assert reply is not None and reply["code"] == "MODEL_UNAVAILABLE", reply
        elif timing == "deadline":
            reply = client.run([*first, answer("too late", delay=DEADLINE_SECONDS * 2)],
                               deadline_seconds=DEADLINE_SECONDS)
            assert reply is not None and reply["status"] == 504, reply
        else:
            _conflict(client, Path(folder) / "journaled")
        client.retry_until_answered("retry")
        return payments.applied


def _conflict(client: Client, marker: Path) -> None:
    """The first attempt runs the tool and waits on a slow model; the client times out and retries; the retry
    replays the tool and waits longer; the first attempt commits, so the retry's write meets 409."""
    slow = client.start([refund_call("first"), answer("Refunded (first attempt).", delay=1.5)], marker=str(marker))
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_SECONDS
    while not marker.exists():
        assert time.monotonic() < deadline and slow[0].is_alive(), "the first attempt never journaled its refund"
        time.sleep(0.05)
    retry = client.run([refund_call("second"), answer("Refunded (retry).", delay=3.5)])
    first = client.finish(slow)
    assert first is not None and first["status"] == 200, first
    # A keyed retry reads the first attempt's receipt back and answers with it; a keyless one gets the conflict.
    assert retry is not None and (retry["replayed"] if client.key else retry["code"] == "SESSION_CONFLICT"), retry


def run_timings(endpoint: str, table: str, timings: list[tuple[str, str]] | None = None,
                run: Any = None) -> list[Row]:
    """Every timing (``TIMINGS`` by default) for each client and payments service, by ``run`` (``run_timing``)."""
    rows = []
    for timing, what in timings or TIMINGS:
        row = Row(timing, what)
        for keyed in (True, False):
            for honour in (True, False):
                applied = (run or run_timing)(endpoint, table, timing, keyed=keyed, honour=honour)
                setattr(row, f"{'keyed' if keyed else 'keyless'}_{'honoured' if honour else 'ignored'}", applied)
        rows.append(row)
    return rows


def expected(row: Row) -> Row:
    """What the guarantee promises for ``row``'s timing (see docs/how-to/side-effects.md)."""
    in_window = row.timing in WINDOWS
    # A keyless re-send after the turn committed is a new turn: this scripted model asks for the refund again.
    new_turn = row.timing in ("before_answer", "conflict")
    return Row(row.timing, row.what, 1, 2 if in_window else 1, 2 if new_turn else 1, 2 if in_window or new_turn else 1)


def table_markdown(rows: list[Row]) -> str:
    lines = [
        "| # | failure of the first attempt | keyed client, key honoured | keyed client, key ignored "
        "| keyless client, key honoured | keyless client, key ignored |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for number, row in enumerate(rows, 1):
        lines.append(f"| {number} | {row.what} | {row.keyed_honoured} | {row.keyed_ignored} | {row.keyless_honoured} "
                     f"| {row.keyless_ignored} |")
    return "\n".join(lines)


# -- the same timings with an approval in the path ---------------------------------------------------------------

#: Every decision attempt's deadline: the claim it writes lapses this long (plus a margin) after it starts.
DECISION_DEADLINE_SECONDS = 2.5
#: The conflict timing's first attempt waits on a slow model, so it gets longer.
SLOW_DECISION_DEADLINE_SECONDS = 4.0
#: The timings of a decision: the same points; the conflict is the retry meeting the first attempt's claim.
DECISION_TIMINGS = [(timing, what) for timing, what in TIMINGS if timing != "conflict"] + [
    ("conflict", "409: the client's retry meets the first attempt's claim while that attempt runs the tool"),
]
#: How long a client keeps re-sending a decision that is still claimed (SESSION_CONFLICT, Retry-After 1 s).
CLAIM_WAIT_SECONDS = 30.0


class DecidingClient(Client):
    """A client whose refund waits for its approval: each attempt re-sends the decision, not the message."""

    async def _open(self) -> str:
        store = DynamoDBSessionStore(self.table, endpoint_url=self.endpoint, region_name=REGION)
        script = ScriptedProvider([refund_call("asked"), answer("unused")])
        engine = FlowEngine([ApprovedRefundFlow], store, ProviderRegistry(override=script))
        response = await engine.run("ApprovedRefundFlow", MESSAGE)
        await engine.close()
        assert response.success and len(response.pending_approvals) == 1, response
        self.approval = response.pending_approvals[0]["id"]
        return response.session

    def start(self, script: list[dict[str, Any]], **task: Any) -> tuple[Any, Path]:
        task.setdefault("deadline_seconds", DECISION_DEADLINE_SECONDS)
        return super().start(script, message=None, approvals=[{"id": self.approval, "approved": True}], **task)

    def retry_until_answered(self, tag: str) -> dict[str, Any]:
        """Re-send the decision until it is answered: applied (200), or already applied (409 not pending);
        a decision still claimed by a failed attempt answers 409 SESSION_CONFLICT until the claim lapses."""
        ends = time.monotonic() + CLAIM_WAIT_SECONDS
        while time.monotonic() < ends:
            reply = self.run([answer("Refunded.")])
            if reply is not None and (reply["status"] == 200 or reply["code"] == "APPROVAL_NOT_PENDING"):
                return reply
            time.sleep(0.5)
        raise AssertionError(f"the decision was not answered after retries: {reply}")


def run_decision_timing(endpoint: str, table: str, timing: str, *, keyed: bool, honour: bool) -> int:
    """Refunds applied when the first attempt of the user's approval fails at ``timing`` and the client retries."""
    with PaymentsServer(honour_keys=honour) as payments, tempfile.TemporaryDirectory() as folder:
        client = DecidingClient(endpoint, table, payments.url, keyed, Path(folder))
        if timing in CRASHES:
            assert client.run([answer("Refunded.")], crash=timing) is None, f"{timing}: the attempt should crash"
        elif timing == "model_outage":
            reply = client.run([{"error": "model down", "status": 400}])
            assert reply is not None and reply["code"] == "MODEL_UNAVAILABLE", reply
        elif timing == "deadline":
            reply = client.run([answer("too late", delay=DECISION_DEADLINE_SECONDS * 2)])
            assert reply is not None and reply["status"] == 504, reply
        else:
            _decision_conflict(client, Path(folder) / "journaled")
        client.retry_until_answered("retry")
        return payments.applied


def _decision_conflict(client: DecidingClient, marker: Path) -> None:
    """The first attempt runs the approved refund and waits on a slow model; the client's retry meets the first
    attempt's live claim (409, retry later) instead of running the refund again."""
    slow = client.start([answer("Refunded (first attempt).", delay=1.5)], marker=str(marker),
                        deadline_seconds=SLOW_DECISION_DEADLINE_SECONDS)
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_SECONDS
    while not marker.exists():
        assert time.monotonic() < deadline and slow[0].is_alive(), "the first attempt never journaled its refund"
        time.sleep(0.05)
    retry = client.run([answer("Refunded (retry).")])
    assert retry is not None and retry["code"] == "SESSION_CONFLICT", retry
    first = client.finish(slow)
    assert first is not None and first["status"] == 200, first


def run_decision_timings(endpoint: str, table: str) -> list[Row]:
    return run_timings(endpoint, table, DECISION_TIMINGS, run_decision_timing)


def expected_decision(row: Row) -> Row:
    """What the guarantee promises with an approval in the path: a decision is applied once whatever the client
    does (a re-sent decision on a settled call is refused), so only the two windows of a key-ignoring payments
    service apply two."""
    twice = 2 if row.timing in WINDOWS else 1
    return Row(row.timing, row.what, 1, twice, 1, twice)
