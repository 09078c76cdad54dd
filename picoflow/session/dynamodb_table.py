"""The sessions table's layout in DynamoDB: its indexes and attribute names, how it is created, and how large
DynamoDB counts an item."""

from __future__ import annotations

import contextlib
from typing import Any

from botocore.exceptions import ClientError

#: DynamoDB's item size limit; it counts attribute names as well as values.
MAX_ITEM_BYTES = 400 * 1024
#: The sparse global secondary index of sessions with calls waiting for a reviewer: its key attribute is present
#: (always ``PENDING``) only on such items, beside the calls themselves in ``REVIEWS`` (JSON text).
REVIEWS_INDEX = "reviews"
REVIEW_QUEUE = "reviewQueue"
REVIEWS = "reviews"
PENDING = "pending"
#: The global secondary index on ``owner`` (keys only) through which ``delete_owner`` finds a principal's items.
OWNER_INDEX = "owner-index"

#: The table's global secondary indexes, as ``create_table`` and the deployment template both declare them.
GLOBAL_SECONDARY_INDEXES: tuple[dict[str, Any], ...] = (
    {
        "IndexName": OWNER_INDEX,
        "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    },
    {
        "IndexName": REVIEWS_INDEX,
        "KeySchema": [{"AttributeName": REVIEW_QUEUE, "KeyType": "HASH"}],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [REVIEWS]},
    },
)


def item_size(item: dict[str, dict[str, Any]]) -> int:
    """DynamoDB's size of an item of scalar attributes: UTF-8 names plus values (numbers by significant digits)."""
    total = 0
    for name, value in item.items():
        total += len(name.encode("utf-8"))
        if "S" in value:
            total += len(value["S"].encode("utf-8"))
        elif "B" in value:
            total += len(value["B"])
        elif "N" in value:
            digits = value["N"].lstrip("-").replace(".", "").strip("0") or "0"
            total += (len(digits) + 1) // 2 + 1
        else:
            raise ValueError(f"item_size handles scalar S, N and B attributes only, not {sorted(value)}")
    return total


def create_table(client: Any, table_name: str) -> None:
    """Create an on-demand sessions table keyed by ``id`` (S) with the owner index (``OWNER_INDEX``) and the
    sparse index of calls waiting for a reviewer (``REVIEWS_INDEX``), wait for it, and turn TTL on for
    ``expiresAt``."""
    client.create_table(
        TableName=table_name,
        AttributeDefinitions=[
            {"AttributeName": "id", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
            {"AttributeName": REVIEW_QUEUE, "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[dict(index) for index in GLOBAL_SECONDARY_INDEXES],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    # Some emulators do not implement TTL; the table works without it.
    with contextlib.suppress(ClientError):
        client.update_time_to_live(
            TableName=table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiresAt"}
        )
