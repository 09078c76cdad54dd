"""The WebSocket API: each message runs one turn, whose events are posted back to the connection as they happen.

Python Lambda functions cannot stream an HTTP response, but an API Gateway WebSocket API lets a function post
any number of messages to a connection (``apigatewaymanagementapi``'s ``PostToConnection``). A message is the
body of ``POST /ai/run`` plus the two headers it cannot carry: ``{"flowName", "message"?, "config"?, "files"?,
"session"?, "idempotencyKey"?}``, read by the same rules. Every event is posted as ``{"event", "data"}``.

The caller is authenticated once, when the connection opens: ``$connect``'s authorizer
(``picoflow.aws.ws_authorizer``, a function of its own) checks the JWT the client offered as a subprotocol and
hands the principal to every later message of the connection; ``$connect`` agrees on the ``picoflow``
subprotocol. A client that disconnects mid-turn does not stop the turn: it commits, and a retry with the same
``idempotencyKey`` answers the committed reply in one ``committed`` event.
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

from picoflow.aws import ws_authorizer
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


def handle(event: Mapping[str, Any], context: InvocationContext | None, client: Any = None) -> dict[str, Any]:
    """Answer one WebSocket API event: connects and disconnects are accepted, a message runs a turn.

    ``client`` is the ``apigatewaymanagementapi`` client to post with; by default one for the connection's
    own endpoint.
    """
    request = event.get("requestContext") or {}
    if request.get("eventType") == "CONNECT" and ws_authorizer.SUBPROTOCOL in ws_authorizer.offered_protocols(event):
        # Past the authorizer already. A browser that offered subprotocols drops a connection agreeing on none.
        return {**_OK, "headers": {"Sec-WebSocket-Protocol": ws_authorizer.SUBPROTOCOL}}
    if request.get("eventType") != "MESSAGE":
        # $disconnect needs nothing done.
        return _OK
    deliver = poster(client or management_client(request), str(request.get("connectionId")))
    request_id = str(getattr(context, "aws_request_id", None) or request.get("requestId") or "")
    caller = (request.get("authorizer") or {}).get(ws_authorizer.PRINCIPAL_KEY) or None
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
    endpoint = f"https://{request.get('domainName')}/{request.get('stage')}"
    return boto3.client("apigatewaymanagementapi", endpoint_url=endpoint, config=POST_TIMEOUTS)


def poster(client: Any, connection_id: str) -> Deliver:
    """Posts each event to ``connection_id``; reports the client gone once the connection is."""

    def deliver(event: TurnEvent) -> bool:
        try:
            client.post_to_connection(ConnectionId=connection_id, Data=event_json(event).encode("utf-8"))
        except client.exceptions.GoneException:
            return False
        except (ClientError, BotoCoreError) as exc:
            # One lost event (a throttled or failed post) must not stop the turn; later events may still land.
            logger.warning("Could not post an event", extra={"event": event.event, "errorType": type(exc).__name__})
        return True

    return deliver
