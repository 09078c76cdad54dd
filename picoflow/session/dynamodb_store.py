"""The production session store: one DynamoDB item per session, the document compressed into one binary attribute.

Item layout (partition key ``id``)::

    id S | revision N | flowName S | runStatus S | saveOn S | expiresAt N (only with a TTL) | owner S (only when
    an authenticated principal created the session) | doc B
    | reviewQueue S, reviews S (only while calls wait for a reviewer: the sparse index "reviews")

``doc`` is the zlib-compressed compact JSON of the whole document. Keeping the document binary
avoids DynamoDB's number and empty-value rules altogether and cuts the write units per turn.

The effect journal (``picoflow.session.journal``) lives in the same table, one small item per recorded effect
call, under an ``id`` no session can have (session ids never contain ``#``)::

    id S = "effect#<key>" | session S | outcome B | expiresAt N (always: 24 hours on) | owner S (as the session's)

The table's TTL on ``expiresAt`` removes the entries; a read ignores one whose time is past meanwhile.

Erasure (``delete_owner``) finds a principal's items through the global secondary index ``OWNER_INDEX``, keyed by
``owner`` and projecting keys only. Items without ``owner`` (anonymous sessions) are not in it, so it stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import zlib
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from picoflow.deadline import current_deadline
from picoflow.errors import (
    SessionConflictError,
    SessionFlowInvariantError,
    SessionStoreError,
    SessionTooLargeError,
)
from picoflow.session.approvals import review_entries, still_waiting
from picoflow.session.document import (
    FlowDoc,
    SessionDoc,
    decode_document,
    encode_document,
    format_timestamp,
    new_document,
    prepare_write,
)
from picoflow.session.dynamodb_client import CLIENT_CONFIG as CLIENT_CONFIG
from picoflow.session.dynamodb_client import CONNECT_TIMEOUT_SECONDS as CONNECT_TIMEOUT_SECONDS
from picoflow.session.dynamodb_client import MAX_ATTEMPTS as MAX_ATTEMPTS
from picoflow.session.dynamodb_client import READ_TIMEOUT_SECONDS as READ_TIMEOUT_SECONDS
from picoflow.session.dynamodb_client import longest_request_seconds as longest_request_seconds
from picoflow.session.dynamodb_client import user_agent_extra as user_agent_extra
from picoflow.session.dynamodb_table import MAX_ITEM_BYTES as MAX_ITEM_BYTES
from picoflow.session.dynamodb_table import OWNER_INDEX as OWNER_INDEX
from picoflow.session.dynamodb_table import PENDING as PENDING
from picoflow.session.dynamodb_table import REVIEW_QUEUE as REVIEW_QUEUE
from picoflow.session.dynamodb_table import REVIEWS as REVIEWS
from picoflow.session.dynamodb_table import REVIEWS_INDEX as REVIEWS_INDEX
from picoflow.session.dynamodb_table import create_table as create_table
from picoflow.session.dynamodb_table import item_size as item_size
from picoflow.session.journal import decode_outcome, encode_outcome, expiry
from picoflow.session.store import SessionStore

COMPRESSION_LEVEL = 6
#: What a journal entry's ``id`` starts with; ``#`` is never part of a session id.
EFFECT_ID_PREFIX = "effect#"
#: Passes over the owner index ``delete_owner`` makes at most: the index is updated shortly after each write,
#: so a pass can still list an item just deleted, or miss one written a moment before the erasure began.
ERASE_PASSES = 5
#: Deletes ``delete_owner`` keeps in flight at once.
ERASE_CONCURRENCY = 8

_UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "ServiceUnavailableException",
    }
)


class DynamoDBSessionStore(SessionStore):
    """Session documents in a DynamoDB table keyed by ``id`` (S), with compare-and-swap on ``revision``.

    Every request goes through a botocore DynamoDB client, so its configuration, event hooks, stubs
    (``botocore.stub.Stubber``), moto and tracing instrumentation all apply. The client is, in order:

    - ``client``: a DynamoDB client of your own (``boto3.client("dynamodb")``), used as it is;
    - else one made from ``session`` (a ``boto3.Session`` or a botocore session), or from a private botocore
      session resolving region and credentials as boto3 would; with ``endpoint_url`` and ``region_name``, and
      ``config`` (a botocore ``Config``: timeouts, retry mode and attempts, proxies, user agent) merged over
      ``CLIENT_CONFIG``. Such a client adds ``picoflow/<version>`` to its User-Agent.

    With ``ttl_seconds`` every write stamps ``expiresAt`` so DynamoDB TTL can remove abandoned sessions.
    ``max_document_bytes`` (the item size, names included) defaults to DynamoDB's 400 KB item limit;
    set it lower to keep headroom, never higher.

    Requests run in a worker thread, so a turn can give up on one that hangs when its deadline comes. With
    ``inline_reads_and_writes`` the session's own read and write (``load``, ``save``, ``create``, ``insert``) run
    on the event loop's thread instead whenever the client's timeouts and attempts bound the request within
    the turn's time left (``longest_request_seconds``): the hand-off to a thread costs more CPU than the
    request's own work saves. Only for a process that runs one turn at a time, as a Lambda function does
    (``picoflow.aws`` builds its store so): meanwhile no other task of the loop runs.
    """

    max_document_bytes: int | None = MAX_ITEM_BYTES

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        session: Any = None,
        config: Config | None = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        ttl_seconds: int | None = None,
        inline_reads_and_writes: bool = False,
    ) -> None:
        if client is not None and (session is not None or config is not None):
            raise ValueError("Give DynamoDBSessionStore a client, or a session and/or a config, not both.")
        self.table_name = table_name
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.ttl_seconds = ttl_seconds
        self.inline_reads_and_writes = inline_reads_and_writes
        self._client = client
        self._session = session
        self._config = config
        self._owns_client = client is None
        self._exceptions_loaded = False
        self._client_lock = threading.Lock()

    async def load(self, session_id: str) -> SessionDoc | None:
        if not session_id:
            # DynamoDB rejects an empty key outright; no session can have one.
            return None
        response = await self._call(
            "load",
            session_id,
            "get_item",
            inline=True,
            TableName=self.table_name,
            Key={"id": {"S": session_id}},
            ConsistentRead=True,
            ProjectionExpression="#rev, #doc",
            ExpressionAttributeNames={"#rev": "revision", "#doc": "doc"},
        )
        item = response.get("Item")
        if item is None:
            return None
        try:
            raw = zlib.decompress(item["doc"]["B"])
            revision = int(item["revision"]["N"])
        except (KeyError, ValueError, zlib.error) as exc:
            raise SessionFlowInvariantError(f"Session '{session_id}' has an unreadable stored item: {exc}") from exc
        return decode_document(raw, revision)

    async def create(
        self, flow: FlowDoc | dict[str, Any], *, session_id: str | None = None, owner: str | None = None
    ) -> SessionDoc:
        doc = new_document(flow, session_id, owner)
        await self._put_new("create", doc)
        return doc

    async def insert(self, doc: SessionDoc) -> SessionDoc:
        written = prepare_write(doc, 0)
        await self._put_new("insert", written)
        return written

    async def _put_new(self, operation: str, doc: SessionDoc) -> None:
        await self._call(
            operation,
            doc.id,
            "put_item",
            inline=True,
            TableName=self.table_name,
            Item=self._checked_item(doc),
            ConditionExpression="attribute_not_exists(id)",
        )

    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        written = prepare_write(doc, expected_revision)
        item = self._checked_item(written)
        await self._call(
            "save",
            written.id,
            "put_item",
            inline=True,
            TableName=self.table_name,
            Item=item,
            ConditionExpression="#rev = :expected AND #flow = :flow",
            ExpressionAttributeNames={"#rev": "revision", "#flow": "flowName"},
            ExpressionAttributeValues={":expected": {"N": str(expected_revision)}, ":flow": {"S": written.flow.name}},
        )
        return written

    async def delete(self, session_id: str, expected_revision: int | None = None) -> None:
        if not session_id:
            # Nothing can be stored under an empty key (DynamoDB would reject the request).
            if expected_revision is not None:
                raise SessionConflictError(session_id)
            return
        request: dict[str, Any] = {"TableName": self.table_name, "Key": {"id": {"S": session_id}}}
        if expected_revision is not None:
            request["ConditionExpression"] = "#rev = :expected"
            request["ExpressionAttributeNames"] = {"#rev": "revision"}
            request["ExpressionAttributeValues"] = {":expected": {"N": str(expected_revision)}}
        await self._call("delete", session_id, "delete_item", **request)

    async def load_effect(self, session_id: str, key: str) -> dict[str, Any] | None:
        response = await self._call(
            "load_effect",
            session_id,
            "get_item",
            TableName=self.table_name,
            Key={"id": {"S": EFFECT_ID_PREFIX + key}},
            ConsistentRead=True,
            ProjectionExpression="#out, #exp",
            ExpressionAttributeNames={"#out": "outcome", "#exp": "expiresAt"},
        )
        item = response.get("Item")
        # DynamoDB's TTL removes expired items some time after they expire, so a read checks for itself.
        if item is None or int(item["expiresAt"]["N"]) < time.time():
            return None
        return decode_outcome(zlib.decompress(item["outcome"]["B"]))

    async def record_effect(
        self, session_id: str, key: str, outcome: dict[str, Any], *, owner: str | None = None
    ) -> bool:
        item: dict[str, dict[str, Any]] = {
            "id": {"S": EFFECT_ID_PREFIX + key},
            "session": {"S": session_id},
            "outcome": {"B": zlib.compress(encode_outcome(outcome), COMPRESSION_LEVEL)},
            "expiresAt": {"N": str(expiry())},
        }
        if owner:
            item["owner"] = {"S": owner}
        size = item_size(item)
        if size > MAX_ITEM_BYTES:
            raise SessionTooLargeError(session_id, size, MAX_ITEM_BYTES)
        try:
            await self._call(
                "record_effect",
                session_id,
                "put_item",
                TableName=self.table_name,
                Item=item,
                # An expired entry the table's TTL has not removed yet gives way as well.
                ConditionExpression="attribute_not_exists(id) OR #exp < :now",
                ExpressionAttributeNames={"#exp": "expiresAt"},
                ExpressionAttributeValues={":now": {"N": str(int(time.time()))}},
            )
        except SessionConflictError:
            return False
        return True

    async def list_reviews(self, limit: int = 100) -> list[dict[str, Any]]:
        """One query of the sparse index ``REVIEWS_INDEX``: only sessions with calls waiting for a reviewer are in it
        (the index is eventually consistent, so a call decided a moment ago may still be listed)."""
        entries: list[dict[str, Any]] = []
        request: dict[str, Any] = {
            "TableName": self.table_name, "IndexName": REVIEWS_INDEX, "KeyConditionExpression": "#q = :p",
            "ExpressionAttributeNames": {"#q": REVIEW_QUEUE}, "ExpressionAttributeValues": {":p": {"S": PENDING}},
        }
        while True:
            response = await self._call("list_reviews", "", "query", **request)
            for item in response.get("Items", ()):
                with contextlib.suppress(KeyError, ValueError):
                    entries.extend(json.loads(item[REVIEWS]["S"]))
            last = response.get("LastEvaluatedKey")
            if not last or len(entries) >= limit * 2:
                break
            request["ExclusiveStartKey"] = last
        return still_waiting(entries, limit)

    async def delete_owner(self, owner: str) -> int:
        if not owner:
            raise ValueError("delete_owner needs a principal; anonymous sessions belong to nobody.")
        sessions = 0
        tried: set[str] = set()
        limit = asyncio.Semaphore(ERASE_CONCURRENCY)

        async def erase(item_id: str) -> bool:
            async with limit:
                return await self._delete_owned(item_id, owner)

        for _ in range(ERASE_PASSES):
            found = [item_id for item_id in await self._owned_ids(owner) if item_id not in tried]
            if not found:
                break
            tried.update(found)
            erased = await asyncio.gather(*(erase(item_id) for item_id in found))
            removed = [item_id for item_id, gone in zip(found, erased, strict=True) if gone]
            sessions += sum(1 for item_id in removed if not item_id.startswith(EFFECT_ID_PREFIX))
        return sessions

    async def _owned_ids(self, owner: str) -> list[str]:
        """The ids the owner index lists for ``owner``, every page of them."""
        ids: list[str] = []
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": OWNER_INDEX,
            "KeyConditionExpression": "#owner = :owner",
            "ExpressionAttributeNames": {"#owner": "owner"},
            "ExpressionAttributeValues": {":owner": {"S": owner}},
        }
        while True:
            page = await self._call("delete_owner", "", "query", **request)
            ids.extend(item["id"]["S"] for item in page.get("Items", []))
            if not page.get("LastEvaluatedKey"):
                return ids
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def _delete_owned(self, item_id: str, owner: str) -> bool:
        """Delete ``item_id`` if it still belongs to ``owner``; False when it was already gone."""
        try:
            await self._call(
                "delete_owner",
                item_id,
                "delete_item",
                TableName=self.table_name,
                Key={"id": {"S": item_id}},
                ConditionExpression="#owner = :owner",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues={":owner": {"S": owner}},
            )
        except SessionConflictError:
            return False
        return True

    async def close(self) -> None:
        if not self._owns_client:
            return
        with self._client_lock:
            client, self._client = self._client, None
            self._exceptions_loaded = False
        if client is not None:
            await asyncio.to_thread(client.close)

    @property
    def client(self) -> Any:
        """The low-level DynamoDB client every request goes through (created on first use unless one was given)."""
        return self._get_client()

    def stored_size(self, doc: SessionDoc) -> int:
        """Bytes of the DynamoDB item for ``doc``: attribute names plus values, with the document compressed."""
        return item_size(self._item(doc))

    def _item(self, doc: SessionDoc) -> dict[str, dict[str, Any]]:
        item: dict[str, dict[str, Any]] = {
            "id": {"S": doc.id},
            "revision": {"N": str(doc.revision)},
            "flowName": {"S": doc.flow.name},
            "runStatus": {"S": doc.run_status},
            "saveOn": {"S": format_timestamp(doc.save_on)},
            "doc": {"B": zlib.compress(encode_document(doc), COMPRESSION_LEVEL)},
        }
        if doc.owner:
            item["owner"] = {"S": doc.owner}
        if self.ttl_seconds is not None:
            item["expiresAt"] = {"N": str(int(time.time()) + self.ttl_seconds)}
        reviews = review_entries(doc)
        if reviews:
            # Only items with calls waiting for a reviewer carry the key of the sparse index REVIEWS_INDEX.
            item[REVIEW_QUEUE] = {"S": PENDING}
            item[REVIEWS] = {"S": json.dumps(reviews, ensure_ascii=False, separators=(",", ":"))}
        return item

    def _checked_item(self, doc: SessionDoc) -> dict[str, dict[str, Any]]:
        item = self._item(doc)
        size = item_size(item)
        limit = self._limit()
        if size > limit:
            raise SessionTooLargeError(doc.id, size, limit)
        return item

    def _bounded_in_turn(self, client: Any) -> bool:
        """Whether a request may run on the loop's thread now: allowed, and bounded within the turn's time left."""
        if not self.inline_reads_and_writes:
            return False
        deadline = current_deadline()
        if deadline is None:
            return True
        # A client that is not botocore's (a test double) says nothing of its timeouts: keep it on a thread.
        config = getattr(getattr(client, "meta", None), "config", None)
        longest = longest_request_seconds(config) if config is not None else None
        return longest is not None and longest <= deadline - time.monotonic()

    def _limit(self) -> int:
        return min(self.max_document_bytes or MAX_ITEM_BYTES, MAX_ITEM_BYTES)

    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                config = CLIENT_CONFIG.merge(self._config) if self._config is not None else CLIENT_CONFIG
                # Appended to, not replaced by, the caller's own extra (read with getattr: the stubs omit it).
                extra = " ".join(filter(None, (getattr(config, "user_agent_extra", None), user_agent_extra())))
                config = config.merge(Config(user_agent_extra=extra))
                options = {"endpoint_url": self.endpoint_url, "region_name": self.region_name, "config": config}
                session = self._session
                if session is None:
                    import botocore.session

                    # A private session: botocore's default session is not safe to share between threads.
                    session = botocore.session.Session()
                create = getattr(session, "create_client", None) or session.client  # botocore's or boto3's
                self._client = create("dynamodb", **options)
            if not self._exceptions_loaded:
                # botocore builds a client's modeled exceptions on first use, unlocked: two threads doing it at once
                # get two sets of classes, and a conflict raised from one escapes an except clause naming the other.
                self._client.exceptions  # noqa: B018 - the property access is the point
                self._exceptions_loaded = True
            return self._client

    async def _call(
        self, operation: str, session_id: str, method: str, *, inline: bool = False, **request: Any
    ) -> dict[str, Any]:
        client = self._get_client()
        send = getattr(client, method)
        try:
            if inline and self._bounded_in_turn(client):
                return send(**request)  # type: ignore[no-any-return]
            return await asyncio.to_thread(lambda: send(**request))
        except client.exceptions.ConditionalCheckFailedException:
            raise SessionConflictError(session_id) from None
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            if code == "ConditionalCheckFailedException":
                # The same failure as another set of modeled classes (a given client whose exceptions were built twice).
                raise SessionConflictError(session_id) from None
            if code == "ValidationException" and "item size" in str(error.get("Message", "")).lower():
                limit = self._limit()
                size = item_size(request["Item"]) if "Item" in request else limit + 1
                raise SessionTooLargeError(session_id, size, limit) from exc
            http_status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            unavailable = code in _UNAVAILABLE_CODES or http_status == 503
            raise SessionStoreError(
                operation, session_id, f"{code or 'ClientError'}: {error.get('Message', '')}".strip(),
                status_code=503 if unavailable else 500,
            ) from exc
        except BotoConnectionError as exc:
            # The connection was never made, so nothing reached the table.
            raise SessionStoreError(operation, session_id, f"{type(exc).__name__}: {exc}", status_code=503) from exc
        except HTTPClientError as exc:
            # Sent, then no answer (read timeout, connection dropped): a write may have landed all the same.
            raise SessionStoreError(
                operation, session_id, f"{type(exc).__name__}: {exc}", status_code=503, ambiguous=method != "get_item"
            ) from exc
        except BotoCoreError as exc:
            raise SessionStoreError(operation, session_id, f"{type(exc).__name__}: {exc}") from exc
