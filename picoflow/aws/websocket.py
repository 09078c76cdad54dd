"""The WebSocket API: each message runs one turn, whose events are posted back to the connection as they happen.

Python Lambda functions cannot stream an HTTP response, but an API Gateway WebSocket API lets a function post
any number of messages to a connection (``apigatewaymanagementapi``'s ``PostToConnection``). A message is the
body of ``POST /ai/run`` plus the two headers it cannot carry: ``{"flowName", "message"?, "config"?, "files"?,
"session"?, "idempotencyKey"?}``, read by the same rules. Every event is posted as ``{"event", "data"}``; one
larger than a WebSocket message may be (API Gateway's 128 KB) is posted as ``part`` messages the client joins back
into it (``Reassembler``), so every turn still ends with exactly one final event however long its reply.

The caller is authenticated once, when the connection opens: ``$connect``'s authorizer
(``picoflow.aws.ws_authorizer``, a function of its own) checks the JWT the client offered as a subprotocol and
hands the principal to every later message of the connection; ``$connect`` agrees on the ``picoflow``
subprotocol. A client that disconnects mid-turn does not stop the turn: it commits, and a retry with the same
``idempotencyKey`` answers the committed reply in one ``committed`` event.

``$connect`` and ``$disconnect`` keep a record of the principal's newest connection
(``picoflow.aws.ws_connections``), so that a reviewer's decision on one of their sessions can be followed up on it
(``picoflow.aws.ws_push``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from picoflow.aws import ws_authorizer, ws_connections
from picoflow.aws.deadline import InvocationContext
from picoflow.aws.observability import logger, metrics, record_turn
from picoflow.aws.refusals import Refusal, refusal
from picoflow.aws.runtime import get_runtime
from picoflow.aws.streams import Deliver, StreamedTurn, event_json, read_turn, refused, relay_turn
from picoflow.events import TurnEvent

SESSION_FIELD = "session"
KEY_FIELD = "idempotencyKey"
# One post is a small message on a nearby endpoint: a stalled one must not hold up the turn's other events.
POST_TIMEOUTS = Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "total_max_attempts": 2})

_OK = {"statusCode": 200}
#: API Gateway's limit on one WebSocket message (``PostToConnection`` refuses more with ``PayloadTooLargeException``).
MAX_MESSAGE_BYTES = 128 * 1024
PART_EVENT = "part"
# Room left in a part for its envelope: {"event": "part", "data": {"seq", "index", "count", "text"}}.
_PART_OVERHEAD = 256


def handle(event: Mapping[str, Any], context: InvocationContext | None, client: Any = None) -> dict[str, Any]:
    """Answer one WebSocket API event: connects and disconnects are accepted, a message runs a turn.

    ``client`` is the ``apigatewaymanagementapi`` client to post with; by default one for the connection's
    own endpoint.
    """
    request = event.get("requestContext") or {}
    if request.get("eventType") in ("CONNECT", "DISCONNECT"):
        # Where a reviewer's decision can be followed up at once (picoflow.aws.ws_push).
        ws_connections.track(request)
    if request.get("eventType") == "CONNECT" and ws_authorizer.SUBPROTOCOL in ws_authorizer.offered_protocols(event):
        # Past the authorizer already. A browser that offered subprotocols drops a connection agreeing on none.
        return {**_OK, "headers": {"Sec-WebSocket-Protocol": ws_authorizer.SUBPROTOCOL}}
    if request.get("eventType") != "MESSAGE":
        return _OK
    deliver = poster(client or management_client(request), str(request.get("connectionId")))
    request_id = str(getattr(context, "aws_request_id", None) or request.get("requestId") or "")
    caller = ws_connections.principal_of(request)
    turn = read_message(event.get("body"))
    if isinstance(turn, Refusal):
        logger.info("Message refused", extra={"code": turn.code, "statusCode": turn.status_code})
        deliver(refused(turn, None, request_id))
        return _OK
    runtime, started = get_runtime(), time.perf_counter()
    result = relay_turn(runtime, turn, deliver, caller=caller, context=context, request_id=request_id)
    flow_name = turn.request.flow_name
    record_turn(flow_name, flow_name in runtime.engine.get_flow_names(), result, (time.perf_counter() - started) * 1000)
    return _OK


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The WebSocket API's Lambda handler: every route of the API (its authorizer is a function of its own)."""
    return handle(event, context)


def read_message(body: Any) -> StreamedTurn | Refusal:
    """The turn a message asks for (``picoflow.aws.streams.StreamedTurn``), or its refusal."""
    try:
        data = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return refusal([{"type": "json_invalid", "loc": ("body",)}])
    if not isinstance(data, dict):
        return refusal([{"type": "model_type", "loc": ("body",)}])
    fields = {name: value for name, value in data.items() if name not in (SESSION_FIELD, KEY_FIELD, "action")}
    return read_turn(fields, data.get(SESSION_FIELD), data.get(KEY_FIELD))


def management_client(request: Mapping[str, Any]) -> Any:
    """An ``apigatewaymanagementapi`` client for the API and stage the event came through."""
    return boto3.client("apigatewaymanagementapi", endpoint_url=ws_connections.endpoint_of(request),
                        config=POST_TIMEOUTS)


def poster(client: Any, connection_id: str) -> Deliver:
    """Posts each event to ``connection_id``; reports the client gone once the connection is."""

    sequence = 0

    def deliver(event: TurnEvent) -> bool:
        nonlocal sequence
        sequence += 1
        for message in messages(event_json(event), sequence):
            try:
                client.post_to_connection(ConnectionId=connection_id, Data=message.encode("utf-8"))
            except client.exceptions.GoneException:
                return False
            except (ClientError, BotoCoreError) as exc:
                # One lost event (a throttled or failed post) must not stop the turn; later events may still land.
                logger.warning("Could not post an event",
                               extra={"event": event.event, "errorType": type(exc).__name__})
                return True
        return True

    return deliver


def messages(text: str, sequence: int, limit: int = MAX_MESSAGE_BYTES) -> list[str]:
    """The WebSocket messages carrying one event's JSON ``text``: itself, or ``part`` messages when it is too large.

    Part ``index`` of ``count`` holds the next slice of ``text``; parts of one event share ``seq``. ``text`` is
    ASCII (``json.dumps`` escapes the rest), so its length is its size in bytes.
    """
    if len(text) <= limit:
        return [text]
    budget = limit - _PART_OVERHEAD
    slices: list[str] = []
    start = 0
    while start < len(text):
        piece = text[start:start + budget]
        # Quotes and backslashes are escaped once more inside the part: take fewer characters until it fits.
        # Half the budget always fits, as escaping at most doubles a slice.
        while (excess := len(piece) + piece.count('"') + piece.count("\\") - budget) > 0:
            piece = piece[: max(budget // 2, len(piece) - excess)]
        slices.append(piece)
        start += len(piece)
    return [json.dumps({"event": PART_EVENT, "data": {"seq": sequence, "index": index, "count": len(slices),
                                                        "text": piece}})
            for index, piece in enumerate(slices)]


class Reassembler:
    """Joins ``part`` messages back into the event they carry: what a client of this API does with each message.

    ``add`` takes one message's JSON and returns the ``{"event", "data"}`` it completes, or None while parts of
    an event are still missing.
    """

    def __init__(self) -> None:
        self._parts: dict[int, list[str | None]] = {}

    def add(self, message: str) -> dict[str, Any] | None:
        """The event ``message`` is or completes; None when it is a part and more are to come."""
        decoded: dict[str, Any] = json.loads(message)
        if decoded.get("event") != PART_EVENT:
            return decoded
        data = decoded["data"]
        parts = self._parts.setdefault(int(data["seq"]), [None] * int(data["count"]))
        parts[int(data["index"])] = str(data["text"])
        if any(part is None for part in parts):
            return None
        del self._parts[int(data["seq"])]
        event: dict[str, Any] = json.loads("".join(part or "" for part in parts))
        return event
