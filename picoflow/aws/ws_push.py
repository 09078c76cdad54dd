"""A reviewer's decision followed up at once on the WebSocket the session's owner has open.

When a reviewer decides a call (``POST /ai/approvals``), the approved tool runs in that request and its result
joins the step's memory; the model has not read it yet. If the session's owner has a WebSocket connection open
(``picoflow.aws.ws_connections``), the same request then runs the model's follow-up turn for the session, a turn
without a user message, as the owner, and posts its events to that connection exactly as a WebSocket turn posts
its own (``step``, ``tool``, ``delta``... then ``committed``, split into ``part`` messages past 128 KB). A decision
that a handler answered in code (a direct reply) is posted as it is, in one ``committed`` event: the model has
nothing to add.

Nothing is lost when nobody is connected: no follow-up runs, and the user's next turn gets the model's answer as
before. The connection is checked first (``GetConnection``): a gone one is forgotten and the follow-up left to the
next turn too. A connection that drops while the follow-up is being posted leaves it committed in the session's
history.

A follow-up runs at most once per decided call: its turn is keyed by the approval's id (a second run replays the
stored answer, which is not posted again), and a replayed decision (a retry with the same ``Idempotency-Key``)
pushes nothing. A follow-up that fails before posting anything posts nothing (the next turn answers instead).

The reviewer's answer waits for the follow-up, which is bounded: it gets at most ``FOLLOW_UP_SECONDS``, and never
more than the invocation has left less ``ANSWER_RESERVE_SECONDS`` for the reviewer's own answer; with less than
``MIN_FOLLOW_UP_SECONDS`` to give it does not start. A follow-up that runs out of time commits nothing and is
answered on the user's next turn.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from picoflow.aws import websocket
from picoflow.aws.deadline import InvocationContext
from picoflow.aws.observability import logger
from picoflow.aws.requests import RunRequest
from picoflow.aws.runtime import Runtime
from picoflow.aws.streams import Deliver, StreamedTurn, relay_turn
from picoflow.aws.ws_connections import Connection, ConnectionBook
from picoflow.events import TurnEvent
from picoflow.results import RunResponse
from picoflow.session.document import SessionDoc

#: The longest a reviewer's answer waits for the follow-up turn.
FOLLOW_UP_SECONDS = 12.0
#: Left of the invocation for the reviewer's own answer once the follow-up is done or cut short.
ANSWER_RESERVE_SECONDS = 1.0
#: Below this, a follow-up would only run out of time: it is left to the user's next turn.
MIN_FOLLOW_UP_SECONDS = 3.0


def follow_up_key(approval_id: str) -> str:
    """The idempotency key of the follow-up turn of the decision on ``approval_id``: one follow-up per call."""
    return f"picoflow-follow-up:{approval_id}"


def push_follow_up(runtime: Runtime, decision: RunResponse, stored: SessionDoc, approval_id: str,
                   context: InvocationContext | None) -> bool:
    """Run and post the model's follow-up to a reviewer's ``decision`` on ``approval_id`` of the session ``stored``
    (as loaded before the decision) when its owner is connected; never raises. True when a follow-up was posted."""
    owner = stored.owner
    if not decision.success or decision.replayed or not owner:
        return False
    book = ConnectionBook.of(runtime.engine.session_store)
    if book is None:
        return False
    budget = follow_up_budget(context)
    if budget < MIN_FOLLOW_UP_SECONDS:
        logger.info("No time left to push a follow-up", extra={"session": decision.session})
        return False
    try:
        connection = book.find(owner)
        if connection is None:
            return False
        client = management_client(connection.endpoint)
        if not connected(client, connection):
            book.forget(owner, connection.connection_id)
            return False
    except (ClientError, BotoCoreError) as exc:
        logger.warning("Could not find the owner's connection", extra={"errorType": type(exc).__name__})
        return False
    deliver = _watched(websocket.poster(client, connection.connection_id), book, owner, connection)
    if decision.message:
        return deliver(TurnEvent.ending(decision))
    turn = StreamedTurn(RunRequest(flowName=stored.flow.name), decision.session, follow_up_key(approval_id))
    request_id = uuid.uuid4().hex
    logger.info("Pushing a follow-up", extra={"session": decision.session, "followUpRequestId": request_id})
    try:
        result = relay_turn(runtime, turn, deliver, caller=owner, context=_Budget(budget), request_id=request_id)
    except Exception as exc:  # noqa: BLE001 - the reviewer's decision stands whatever becomes of the push
        logger.warning("The follow-up failed", extra={"errorType": type(exc).__name__})
        return False
    return result.success and not result.replayed


def follow_up_budget(context: InvocationContext | None) -> float:
    """Seconds the follow-up may take in an invocation with ``context`` (no context: ``FOLLOW_UP_SECONDS``)."""
    if context is None:
        return FOLLOW_UP_SECONDS
    return min(FOLLOW_UP_SECONDS, context.get_remaining_time_in_millis() / 1000 - ANSWER_RESERVE_SECONDS)


def management_client(endpoint: str) -> Any:
    """An ``apigatewaymanagementapi`` client for ``endpoint``, with the WebSocket API's short post timeouts."""
    return boto3.client("apigatewaymanagementapi", endpoint_url=endpoint, config=websocket.POST_TIMEOUTS)


def connected(client: Any, connection: Connection) -> bool:
    """Whether ``connection`` is still open (``GetConnection``; ``GoneException`` when it is not)."""
    try:
        client.get_connection(ConnectionId=connection.connection_id)
    except client.exceptions.GoneException:
        return False
    return True


def _watched(deliver: Deliver, book: ConnectionBook, owner: str, connection: Connection) -> Deliver:
    """``deliver`` that forgets the connection once it is gone, and posts no final event that is all there is and
    tells nothing new (a replayed follow-up, or one that failed before anything was posted)."""
    posted = False

    def watched(event: TurnEvent) -> bool:
        nonlocal posted
        response = event.response
        if event.final and not posted and response is not None and (response.replayed or not response.success):
            return True
        posted = True
        if deliver(event):
            return True
        try:
            book.forget(owner, connection.connection_id)
        except (ClientError, BotoCoreError) as exc:
            logger.warning("Could not forget a gone connection", extra={"errorType": type(exc).__name__})
        return False

    return watched


class _Budget:
    """An invocation context whose remaining time is the follow-up's budget, counted from now."""

    def __init__(self, seconds: float) -> None:
        self._ends = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(int((self._ends - time.monotonic()) * 1000), 0)
