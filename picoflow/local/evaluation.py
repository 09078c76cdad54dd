"""Running scenarios for ``picoflow eval``: each run is one new session, its turns sent in order and checked.

A turn is sent to a ``Target``: ``InProcessTarget`` gives the project's Lambda handler the API Gateway event of
``POST /ai/run``, ``HttpTarget`` posts it to a served or deployed API. After each turn the session document is
read where the target can (in process through the handler module's ``read_session``; over HTTP through
``GET /ai/session``, which only ``picoflow serve`` answers) for the ``step`` and ``state`` checks and the turn's
tokens. A turn passes when its reply succeeded, every check that could be made holds and the judge's score
reaches the turn's minimum; a turn whose request failed ends its run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.local.inspector import SESSION_ROUTE, session_reader
from picoflow.local.judge import Judge, JudgeCase
from picoflow.local.project import LambdaHandler
from picoflow.local.scenario import Scenario, ScenarioTurn
from picoflow.wire import JSON, SESSION_HEADER, SESSION_HEADER_SPELLINGS, read_envelope

# A little above the deployed function's 25 s, so the API's own timeout answer arrives first.
REQUEST_TIMEOUT_SECONDS = 35.0
RUN_ROUTE = "/ai/run"
#: The check a turn fails when its request was refused or failed.
REPLY_CHECK = "reply"
#: The status of an ``Exchange`` whose request got no HTTP answer.
NO_ANSWER = 0

#: Called with one line of progress after every turn.
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Exchange:
    """One answered ``POST /ai/run``: the status, the headers (lower-case names) and the body."""

    status: int
    headers: Mapping[str, str]
    body: str
    latency_ms: float

    @property
    def envelope(self) -> dict[str, Any] | None:
        """The JSON envelope, or None when the step answered with a raw body of its own content type."""
        return read_envelope(self.headers.get("content-type", ""), self.body)

    @property
    def session(self) -> str | None:
        """The session the answer names, in its header or its envelope."""
        for name in SESSION_HEADER_SPELLINGS:
            if self.headers.get(name):
                return self.headers[name]
        envelope = self.envelope
        return (envelope or {}).get("session") or None


class Target(Protocol):
    """Where a scenario's turns go."""

    async def send(self, body: dict[str, Any], session: str | None) -> Exchange:
        """Post ``body`` to ``/ai/run``, in ``session`` when one is given."""
        ...

    async def read_session(self, session: str) -> dict[str, Any] | None:
        """The JSON form of the session document, or None when this target cannot read it."""
        ...


class InProcessTarget:
    """The project's Lambda handler, invoked in this process with the events API Gateway would send."""

    def __init__(self, handler: LambdaHandler) -> None:
        self._handler = handler
        self._reader = session_reader(handler)
        # Like one Lambda execution environment: Powertools keeps the current event in process-wide state.
        self._lock = threading.Lock()

    async def send(self, body: dict[str, Any], session: str | None) -> Exchange:
        """Invoke the handler with the ``POST /ai/run`` event of ``body``."""
        event = http_event("POST", RUN_ROUTE, body=body, headers={SESSION_HEADER: session} if session else None)
        return await asyncio.to_thread(self._invoke, event)

    async def read_session(self, session: str) -> dict[str, Any] | None:
        """The document through the handler module's ``read_session``; None when the module has none."""
        if self._reader is None:
            return None
        return await asyncio.to_thread(self._reader, session)

    def _invoke(self, event: dict[str, Any]) -> Exchange:
        with self._lock:
            started = time.perf_counter()
            result = self._handler(event, FakeLambdaContext())
            latency = (time.perf_counter() - started) * 1000
        headers = {str(name).lower(): str(value) for name, value in (result.get("headers") or {}).items()}
        body = result.get("body") or ""
        if result.get("isBase64Encoded"):
            body = base64.b64decode(body).decode("utf-8", errors="replace")
        return Exchange(int(result["statusCode"]), headers, body, latency)


class HttpTarget:
    """An API served by ``picoflow serve`` or deployed behind API Gateway, at ``base_url``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        # Set once the API answers GET /ai/session with anything but a document: a deployed API has no such route.
        self._unreadable = False

    async def send(self, body: dict[str, Any], session: str | None) -> Exchange:
        """``POST /ai/run`` with ``body`` as JSON."""
        headers = {"Content-Type": JSON, **({SESSION_HEADER: session} if session else {})}
        return await asyncio.to_thread(self._request, "POST", RUN_ROUTE, json.dumps(body).encode("utf-8"), headers)

    async def read_session(self, session: str) -> dict[str, Any] | None:
        """The document from ``GET /ai/session``; None, from then on, when the API does not answer it."""
        if self._unreadable:
            return None
        exchange = await asyncio.to_thread(self._request, "GET", SESSION_ROUTE, None, {SESSION_HEADER: session})
        try:
            document = json.loads(exchange.body) if exchange.status == 200 else None
        except ValueError:
            document = None
        if not isinstance(document, dict) or "flow" not in document:
            self._unreadable = exchange.status in (403, 404, 405)
            return None
        return document

    def _request(self, method: str, route: str, data: bytes | None, headers: dict[str, str]) -> Exchange:
        request = urllib.request.Request(self.base_url + route, data=data, method=method, headers=headers)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
                status, raw_headers, payload = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            with error:
                status, raw_headers, payload = error.code, error.headers, error.read()
        except (urllib.error.URLError, OSError) as error:
            # No answer at all (refused, unreachable, timed out): the turn fails like a failed request.
            reason = getattr(error, "reason", error)
            return Exchange(NO_ANSWER, {}, str(reason), (time.perf_counter() - started) * 1000)
        latency = (time.perf_counter() - started) * 1000
        charset = raw_headers.get_content_charset() or "utf-8"
        headers_lower = {name.lower(): value for name, value in raw_headers.items()}
        return Exchange(status, headers_lower, payload.decode(charset, errors="replace"), latency)


class ReportModel(BaseModel):
    """A part of the evaluation's results; its JSON keys are camelCase, like the session document's."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class Check(ReportModel):
    """One deterministic check of a turn; ``passed`` is None when it could not be made (no session document)."""

    name: str
    passed: bool | None
    expected: Any = None
    actual: Any = None

    def describe(self) -> str:
        """One line for reports: what was expected and what came."""
        if self.passed is None:
            return f"{self.name} not checked: the session document cannot be read here"
        return f"{self.name}: expected {_short(self.expected)}, got {_short(self.actual)}"


class TurnResult(ReportModel):
    """The outcome of one turn of one run."""

    index: int = Field(description="1-based position of the turn in the scenario.")
    label: str
    input: str
    expected_response: str
    min_score: float
    reply: str | None = None
    status: int | None = None
    score: float | None = None
    reason: str = ""
    checks: list[Check] = Field(default_factory=list)
    passed: bool = False
    latency_ms: float | None = None
    flow_tokens: int | None = None
    judge_tokens: int | None = None

    def failures(self) -> list[str]:
        """Why the turn failed, one entry per failed check (empty when it passed)."""
        found = [check.describe() for check in self.checks if check.passed is False]
        if self.score is not None and self.score < self.min_score:
            found.append(f"score {self.score:.2f} under the minimum {self.min_score:.2f}")
        if self.score is None and not any(check.name == REPLY_CHECK for check in self.checks):
            found.append(self.reason or "no verdict")
        return found


class RunResult(ReportModel):
    """One run of a scenario: one new session and every turn's outcome."""

    run: int
    session: str | None = None
    turns: list[TurnResult]

    @property
    def passed(self) -> bool:
        """Whether every turn passed."""
        return all(turn.passed for turn in self.turns)


class ScenarioResult(ReportModel):
    """Every run of one scenario file."""

    path: str
    flow_name: str
    judge: str
    runs: list[RunResult]

    @property
    def passed(self) -> bool:
        """Whether every turn of every run passed."""
        return all(run.passed for run in self.runs)


@dataclass(frozen=True)
class Job:
    """One run of one scenario, as the runner schedules it."""

    path: str
    scenario: Scenario
    judge: Judge
    run: int
    runs: int


async def run_jobs(
    jobs: list[Job], target: Target, *, concurrency: int = 1, progress: Progress | None = None
) -> list[ScenarioResult]:
    """Run ``jobs`` (at most ``concurrency`` at a time, in list order when 1) and group them by scenario file."""
    limit = asyncio.Semaphore(max(1, concurrency))

    async def bounded(job: Job) -> RunResult:
        async with limit:
            return await run_once(job, target, progress)

    if concurrency <= 1:
        outcomes = [await run_once(job, target, progress) for job in jobs]
    else:
        outcomes = list(await asyncio.gather(*(bounded(job) for job in jobs)))
    grouped: dict[str, ScenarioResult] = {}
    for job, outcome in zip(jobs, outcomes, strict=True):
        result = grouped.setdefault(
            job.path, ScenarioResult(path=job.path, flow_name=job.scenario.flow_name, judge=job.judge.name, runs=[])
        )
        result.runs.append(outcome)
    for result in grouped.values():
        result.runs.sort(key=lambda run: run.run)
    return list(grouped.values())


async def run_once(job: Job, target: Target, progress: Progress | None = None) -> RunResult:
    """Run ``job``'s scenario once, in a new session, turn after turn; a failed request ends the run."""
    scenario = job.scenario
    session: str | None = None
    tokens_so_far = 0
    results: list[TurnResult] = []
    stopped = False
    waiting: list[str] = []
    for index, turn in enumerate(scenario.turns):
        result = TurnResult(
            index=index + 1, label=scenario.label(index), input=turn.shown(), expected_response=turn.expected_response,
            min_score=scenario.min_score(turn),
        )
        results.append(result)
        if stopped:
            result.reason = "not run: an earlier turn of this run failed"
        else:
            body: dict[str, Any] = {"flowName": scenario.flow_name}
            if turn.input is not None:
                body["message"] = turn.input
            if turn.decision is not None:
                body["approvals"] = [{"id": approval, **turn.decision.model_dump(exclude_none=True)}
                                     for approval in waiting]
            if session is None and scenario.config is not None:
                body["config"] = scenario.config
            exchange = await target.send(body, session)
            session = exchange.session or session
            waiting = user_approvals(exchange.envelope)
            document = await target.read_session(session) if session and _succeeded(exchange.status) else None
            tokens_so_far = await _judge_turn(result, scenario, turn, exchange, document, job.judge, tokens_so_far)
            # The turns after a failed request would talk to a session in an unknown state.
            stopped = any(check.name == REPLY_CHECK for check in result.checks)
        if progress is not None:
            progress(_progress_line(job, result, len(scenario.turns)))
    return RunResult(run=job.run, session=session, turns=results)


def user_approvals(envelope: dict[str, Any] | None) -> list[str]:
    """The ids of the calls a reply left waiting for the user's decision."""
    pending = (envelope or {}).get("pendingApprovals") or []
    return [item["id"] for item in pending if isinstance(item, dict) and item.get("approver") == "user"]


async def _judge_turn(
    result: TurnResult,
    scenario: Scenario,
    turn: ScenarioTurn,
    exchange: Exchange,
    document: dict[str, Any] | None,
    judge: Judge,
    tokens_so_far: int,
) -> int:
    """Fill ``result`` from the answer, the checks and the judge; returns the session's token total so far."""
    result.status, result.latency_ms = exchange.status, round(exchange.latency_ms, 1)
    envelope = exchange.envelope
    if not _succeeded(exchange.status) or (envelope is not None and not envelope.get("success")):
        code = (envelope or {}).get("code")
        result.checks.append(Check(name=REPLY_CHECK, passed=False, expected="success", actual=_failure(exchange, code)))
        result.reason = f"the turn failed: {_failure(exchange, code)}"
        return tokens_so_far
    reply = _reply_text(exchange, envelope)
    result.reply = reply
    result.checks = deterministic_checks(turn, exchange, envelope, document)
    if document is not None:
        total = int((document.get("tokens") or {}).get("totalTokens") or 0)
        result.flow_tokens, tokens_so_far = total - tokens_so_far, total
    case = JudgeCase(
        flow_name=scenario.flow_name, turn=result.label, user_message=turn.shown(), expected=turn.expected_response,
        reply=reply, config=scenario.config,
    )
    judgement = await judge.judge(case)
    result.judge_tokens = judgement.tokens
    if judgement.verdict is None:
        result.reason = judgement.error or "no verdict"
    else:
        result.score, result.reason = judgement.verdict.score, judgement.verdict.reason
    checks_hold = all(check.passed is not False for check in result.checks)
    result.passed = checks_hold and result.score is not None and result.score >= result.min_score
    return tokens_so_far


def deterministic_checks(
    turn: ScenarioTurn, exchange: Exchange, envelope: dict[str, Any] | None, document: dict[str, Any] | None
) -> list[Check]:
    """The checks of ``turn`` that need no model: ``completed`` always, ``contentType``, ``step`` and ``state``
    when the turn has them. A raw (non-envelope) reply says nothing of completion: the document's run status
    does, where it can be read."""
    if envelope is not None:
        completed = bool(envelope.get("completed"))
        content_type = str(envelope.get("contentType") or "")
    else:
        completed = document is not None and document.get("runStatus") == "completed"
        content_type = exchange.headers.get("content-type", "")
    checks = [Check(name="completed", passed=completed == turn.completed, expected=turn.completed, actual=completed)]
    if turn.content_type is not None:
        media_type = content_type.split(";", 1)[0].strip()
        checks.append(Check(name="contentType", passed=media_type == turn.content_type, expected=turn.content_type,
                            actual=media_type))
    if turn.step is not None:
        current = (document or {}).get("flow", {}).get("currentStep") if document is not None else None
        passed = None if document is None else current == turn.step
        checks.append(Check(name="step", passed=passed, expected=turn.step, actual=current))
    for path, expected in (turn.state or {}).items():
        if document is None:
            checks.append(Check(name=f"state {path}", passed=None, expected=expected))
            continue
        found, actual = state_value(document, path)
        checks.append(Check(name=f"state {path}", passed=found and actual == expected, expected=expected,
                            actual=actual if found else "(missing)"))
    return checks


def state_value(document: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """The value at ``StepName.key.key`` in a session document's step state (a list index may be a key too),
    and whether it exists."""
    step_name, _, rest = path.partition(".")
    steps = (document.get("flow") or {}).get("steps") or []
    value: Any = next((step.get("state") or {} for step in steps if step.get("name") == step_name), None)
    if value is None:
        return False, None
    for key in rest.split(".") if rest else []:
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return False, None
    return True, value


def _succeeded(status: int) -> bool:
    return 200 <= status < 300


def _failure(exchange: Exchange, code: str | None) -> str:
    if exchange.status == NO_ANSWER:
        return f"no answer ({exchange.body})"
    return f"HTTP {exchange.status}" + (f" {code}" if code else "")


def _reply_text(exchange: Exchange, envelope: dict[str, Any] | None) -> str:
    if envelope is None:
        return exchange.body
    message = envelope.get("message")
    return message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)


def _progress_line(job: Job, result: TurnResult, turns: int) -> str:
    run = f" run {job.run}/{job.runs}" if job.runs > 1 else ""
    verdict = "pass" if result.passed else "FAIL"
    score = f"score {result.score:.2f}" if result.score is not None else "no score"
    latency = f"{result.latency_ms:.0f} ms" if result.latency_ms is not None else "-"
    return (f"{job.scenario.flow_name}{run} turn {result.index}/{turns} {result.label}: "
            f"{verdict}, {score} (min {result.min_score:.2f}), {latency}")


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
