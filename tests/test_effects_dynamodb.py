"""The effect journal on DynamoDB (moto and DynamoDB Local): its own small item in the sessions table, and the
requests a turn makes, counted by a botocore event hook on the store's client.

An ordinary turn stays one ``GetItem`` and one conditional ``PutItem``; a turn whose effect tool runs adds the
journal lookup (a consistent ``GetItem``) and the journal write (one conditional ``PutItem``); a retry that
replays the journal reads it and writes nothing but the session.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from picoflow import FlowEngine
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.dynamodb_store import EFFECT_ID_PREFIX, DynamoDBSessionStore
from picoflow.session.journal import JOURNAL_TTL_SECONDS
from tests.support.dynamodb_local import DynamoTable
from tests.test_effects import APPLIED, OUTAGE, SupportFlow, refund_call, refunds


@pytest.fixture(params=["moto", "dynamodb-local"])
def table(request: pytest.FixtureRequest) -> DynamoTable:
    return request.getfixturevalue("moto_dynamodb" if request.param == "moto" else "dynamodb_local_table")


@pytest.fixture(autouse=True)
def _fresh_world() -> None:
    APPLIED.clear()


def counted(store: DynamoDBSessionStore) -> list[str]:
    """The operations the store's client sends from now on, in order."""
    sent: list[str] = []

    def before_call(model: Any, **_: Any) -> None:
        sent.append(model.name)

    store.client.meta.events.register("before-call.dynamodb", before_call)
    return sent


def engine_on(store: DynamoDBSessionStore, script: list[Any]) -> FlowEngine:
    return FlowEngine([SupportFlow], store, [ScriptedProvider(script)], retry_delay=0)


async def test_turns_cost_one_read_and_one_write_plus_two_calls_per_effect(table: DynamoTable) -> None:
    store = table.store()
    sent = counted(store)
    session = (await engine_on(store, [{"content": "hello"}]).run("SupportFlow", "hi")).session
    assert sent == ["PutItem"]  # a first turn: one conditional write

    sent.clear()
    ordinary = await engine_on(store, [{"content": "just talk"}]).run("SupportFlow", "how are you?", session)
    assert ordinary.success
    assert sent == ["GetItem", "PutItem"]  # unchanged: one read, one conditional write

    sent.clear()
    failed = await engine_on(store, [refund_call("first"), OUTAGE]).run("SupportFlow", "refund A1", session)
    assert failed.error_code == "MODEL_UNAVAILABLE"
    # The session read, the journal lookup, the journal write; the failed turn writes no session.
    assert sent == ["GetItem", "GetItem", "PutItem"]
    assert len(refunds()) == 1

    sent.clear()
    retried = await engine_on(store, [refund_call("second"), {"content": "refunded"}]).run(
        "SupportFlow", "refund A1", session
    )
    assert retried.success and retried.message == "refunded"
    assert sent == ["GetItem", "GetItem", "PutItem"]  # the session read, the journal replayed, the session write
    assert len(refunds()) == 1


async def test_a_journal_entry_is_a_small_item_that_expires_in_a_day(table: DynamoTable) -> None:
    store = table.store()
    session = (await engine_on(store, [{"content": "hello"}]).run("SupportFlow", "hi")).session
    await engine_on(store, [refund_call("first"), OUTAGE]).run("SupportFlow", "refund A1", session)
    key = refunds()[0][2]
    item = table.client.get_item(TableName=table.name, Key={"id": {"S": EFFECT_ID_PREFIX + key}})["Item"]
    assert set(item) == {"id", "session", "outcome", "expiresAt"}
    assert item["session"] == {"S": session}
    expires = int(item["expiresAt"]["N"])
    assert abs(expires - (time.time() + JOURNAL_TTL_SECONDS)) < 60
    # The attribute the table's TTL reads, as the template and create_table set it.
    ttl = table.client.describe_time_to_live(TableName=table.name)["TimeToLiveDescription"]
    assert ttl.get("AttributeName", "expiresAt") == "expiresAt"
    # Small: the outcome is compressed and holds what the handler changed, not the session.
    assert len(item["outcome"]["B"]) < 1024
    # An id no session can have: a client cannot read it as a session (ids are letters, digits, '_' and '-').
    assert "#" in item["id"]["S"]
    # A committed turn leaves its entry to expire: committing stays one write.
    await engine_on(store, [refund_call("second"), {"content": "refunded"}]).run("SupportFlow", "refund A1", session)
    assert "Item" in table.client.get_item(TableName=table.name, Key={"id": {"S": EFFECT_ID_PREFIX + key}})


async def test_an_expired_entry_not_yet_removed_is_ignored_and_replaced(table: DynamoTable, monkeypatch) -> None:
    store = table.store()
    assert await store.record_effect("s", "old", {"kind": "none"}) is True
    later = time.time() + JOURNAL_TTL_SECONDS + 5
    monkeypatch.setattr(time, "time", lambda: later)
    assert await store.load_effect("s", "old") is None
    assert await store.record_effect("s", "old", {"kind": "new"}) is True
    assert await store.load_effect("s", "old") == {"kind": "new"}


async def test_a_replay_after_a_new_effect_keeps_both_refunds(table: DynamoTable) -> None:
    # The journal fix on the backend where two refunds were once paid and one recorded.
    from tests.test_effects import test_a_replay_after_a_new_effect_keeps_what_the_new_effect_did as scenario

    await scenario(table.store())
