"""Which WebSocket connection a person has open, so something can be pushed to them later (``picoflow.aws.ws_push``).

The record is one small item per principal in the sessions table, beside the sessions and the effect journal::

    id S = "connection#<SHA-256 of the principal, 32 hex digits>" | connectionId S | endpoint S | expiresAt N

It is written when a connection opens and removed when it closes: the connect authorizer's principal reaches every
event of a connection, ``$disconnect``'s included, so opening costs one ``PutItem`` and closing one conditional
``DeleteItem``, and a turn costs nothing. Keyed by principal rather than by session, it reaches the person whatever
session they are looking at (the pushed events name their session), and a session's owner is exactly the
principal that may read its turns. The newest connection wins: a person with two tabs open gets pushes in the one
opened last, and closing the older tab leaves the newer one's record alone (the delete is conditional on the
connection id).

API Gateway closes a connection after two hours at most, so the item expires then (the table's TTL on
``expiresAt``; a read ignores an expired one meanwhile), and a post that finds the connection gone removes it at
once. The principal is hashed in the key, so the table's keys name nobody. Anonymous connections are not recorded:
their sessions have no owner to push to. Only the DynamoDB store keeps these records; with another store nothing is
recorded, and nothing is pushed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from picoflow.aws import ws_authorizer
from picoflow.aws.observability import logger
from picoflow.aws.runtime import get_runtime
from picoflow.errors import SessionStoreError
from picoflow.session.dynamodb_store import DynamoDBSessionStore
from picoflow.session.store import SessionStore

#: What a connection record's ``id`` starts with; ``#`` is never part of a session id.
CONNECTION_ID_PREFIX = "connection#"
#: API Gateway's longest WebSocket connection: a record cannot be needed for longer.
CONNECTION_LIFETIME_SECONDS = 2 * 60 * 60


@dataclass(frozen=True)
class Connection:
    """An open WebSocket connection: its id and the management endpoint that posts to it."""

    connection_id: str
    endpoint: str


def endpoint_of(request: Mapping[str, Any]) -> str:
    """The ``apigatewaymanagementapi`` endpoint of the API and stage a WebSocket event came through."""
    return f"https://{request.get('domainName')}/{request.get('stage')}"


def principal_of(request: Mapping[str, Any]) -> str | None:
    """The principal the connect authorizer gave the connection of ``request``; None when anonymous."""
    return (request.get("authorizer") or {}).get(ws_authorizer.PRINCIPAL_KEY) or None


class ConnectionBook:
    """The connection records of one sessions table; every call is one DynamoDB request (botocore errors raised)."""

    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.table_name = table_name

    @classmethod
    def of(cls, store: SessionStore) -> ConnectionBook | None:
        """The book kept in ``store``'s table; None for a store that keeps none (not DynamoDB)."""
        if isinstance(store, DynamoDBSessionStore):
            return cls(store.client, store.table_name)
        return None

    def remember(self, owner: str, connection: Connection) -> None:
        """Record ``connection`` as ``owner``'s newest."""
        self.client.put_item(TableName=self.table_name, Item={
            "id": {"S": record_id(owner)},
            "connectionId": {"S": connection.connection_id},
            "endpoint": {"S": connection.endpoint},
            "expiresAt": {"N": str(int(time.time()) + CONNECTION_LIFETIME_SECONDS)},
        })

    def find(self, owner: str) -> Connection | None:
        """``owner``'s newest connection, or None when none is recorded (or its record has expired)."""
        item = self.client.get_item(TableName=self.table_name, Key={"id": {"S": record_id(owner)}},
                                    ConsistentRead=True).get("Item")
        # The table's TTL removes expired items some time after they expire, so a read checks for itself.
        if item is None or int(item["expiresAt"]["N"]) < time.time():
            return None
        return Connection(item["connectionId"]["S"], item["endpoint"]["S"])

    def forget(self, owner: str, connection_id: str) -> None:
        """Remove ``owner``'s record if it still names ``connection_id`` (a newer connection's stays)."""
        try:
            self.client.delete_item(
                TableName=self.table_name, Key={"id": {"S": record_id(owner)}},
                ConditionExpression="connectionId = :connection",
                ExpressionAttributeValues={":connection": {"S": connection_id}},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    async def erase(self, owner: str) -> None:
        """Remove ``owner``'s record whatever connection it names (erasing the principal's data);
        ``SessionStoreError`` when the table does not answer."""
        request = {"TableName": self.table_name, "Key": {"id": {"S": record_id(owner)}}}
        try:
            await asyncio.to_thread(lambda: self.client.delete_item(**request))
        except (ClientError, BotoCoreError) as exc:
            raise SessionStoreError("erase_connection", None, type(exc).__name__, status_code=503) from exc


def record_id(owner: str) -> str:
    """The ``id`` of ``owner``'s connection record."""
    return CONNECTION_ID_PREFIX + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:32]


def track(request: Mapping[str, Any]) -> None:
    """Record the connection a ``$connect`` event opens, or forget the one a ``$disconnect`` closes; never raises.

    A record that cannot be written costs the person a push (they get the follow-up on their next turn), never the
    connection itself.
    """
    owner, connection_id = principal_of(request), request.get("connectionId")
    if owner is None or not isinstance(connection_id, str):
        return
    try:
        book = ConnectionBook.of(get_runtime().engine.session_store)
        if book is None:
            return
        if request.get("eventType") == "CONNECT":
            book.remember(owner, Connection(connection_id, endpoint_of(request)))
        else:
            book.forget(owner, connection_id)
    except Exception as exc:  # noqa: BLE001 - an engine that cannot be built, or a table that fails, opens no push
        logger.warning("Could not update the connection record",
                       extra={"eventType": request.get("eventType"), "errorType": type(exc).__name__})
