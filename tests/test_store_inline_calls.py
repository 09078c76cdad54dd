"""The DynamoDB store's session read and write on the event loop's thread (``inline_reads_and_writes``): only when
allowed, only when the client's timeouts bound the request within the turn's time left, and never for the journal.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.config import Config

from picoflow.aws.runtime import build_engine
from picoflow.deadline import turn_deadline
from picoflow.session.dynamodb_store import CLIENT_CONFIG, DynamoDBSessionStore, longest_request_seconds
from picoflow.session.factory import store_from_env
from tests.support.dynamodb_local import DynamoTable

FLOW = {"name": "HotelFlow"}


def sending_threads(store: DynamoDBSessionStore) -> list[tuple[str, int]]:
    """Each request's operation and the thread that sent it, as botocore's ``before-send`` event sees them."""
    seen: list[tuple[str, int]] = []

    def record(request: Any, **_: Any) -> None:
        seen.append((request.headers["X-Amz-Target"].decode().split(".")[-1], threading.get_ident()))

    store.client.meta.events.register("before-send.dynamodb", record)
    return seen


def test_the_longest_request_follows_the_clients_timeouts_attempts_and_backoff() -> None:
    # 3 attempts of 2 s connect + 5 s read, and backoffs of at most 1 s and 2 s between them.
    assert longest_request_seconds(CLIENT_CONFIG) == 3 * (2 + 5) + 1 + 2
    legacy = Config(connect_timeout=1, read_timeout=1, retries={"max_attempts": 2})  # retries after the first
    assert longest_request_seconds(legacy) == 3 * 2 + 1 + 2
    assert longest_request_seconds(Config(retries={"total_max_attempts": 1})) == 60 + 60  # botocore's defaults
    capped = Config(connect_timeout=1, read_timeout=1, retries={"total_max_attempts": 8})
    assert longest_request_seconds(capped) == 8 * 2 + 1 + 2 + 4 + 8 + 16 + 20 + 20
    # Attempts from the environment or a profile are not known: never inline then.
    assert longest_request_seconds(Config()) is None


async def test_reads_and_writes_go_to_a_worker_thread_by_default(moto_dynamodb: DynamoTable) -> None:
    store = moto_dynamodb.store()
    seen = sending_threads(store)
    doc = await store.create(FLOW)
    loaded = await store.load(doc.id)
    assert loaded is not None
    await store.save(loaded, loaded.revision)
    assert [name for name, _ in seen] == ["PutItem", "GetItem", "PutItem"]
    assert threading.get_ident() not in {thread for _, thread in seen}
    await store.close()


async def test_inline_reads_and_writes_run_on_the_loops_thread_but_the_journal_does_not(
    moto_dynamodb: DynamoTable,
) -> None:
    store = moto_dynamodb.store(inline_reads_and_writes=True)
    seen = sending_threads(store)
    loop_thread = threading.get_ident()
    with turn_deadline(time.monotonic() + 60):  # more than the 24 s the client can take
        doc = await store.create(FLOW)
        loaded = await store.load(doc.id)
        assert loaded is not None
        saved = await store.save(loaded, loaded.revision)
        await store.record_effect(doc.id, "k1", {"result": "ok"})
        assert await store.load_effect(doc.id, "k1") == {"result": "ok"}
    assert saved.revision == 1
    assert [name for name, _ in seen] == ["PutItem", "GetItem", "PutItem", "PutItem", "GetItem"]
    assert [thread == loop_thread for _, thread in seen] == [True, True, True, False, False]
    await store.close()


async def test_with_less_time_left_than_the_client_can_take_the_call_goes_to_a_thread(
    moto_dynamodb: DynamoTable,
) -> None:
    store = moto_dynamodb.store(inline_reads_and_writes=True)
    seen = sending_threads(store)
    with turn_deadline(time.monotonic() + 10):  # the client may take 24 s: a hung call must stay abandonable
        doc = await store.create(FLOW)
        await store.load(doc.id)
    assert len(seen) == 2 and threading.get_ident() not in {thread for _, thread in seen}
    # Without a turn deadline there is nothing to abandon a call for.
    seen.clear()
    await store.load(doc.id)
    assert seen[0][1] == threading.get_ident()
    await store.close()


async def test_a_client_that_is_not_botocores_stays_on_a_thread_under_a_deadline() -> None:
    class Double:
        """Answers GetItem as an empty table would, recording the thread it ran on; no botocore ``meta``."""

        class exceptions:  # noqa: N801 - botocore's attribute name
            class ConditionalCheckFailedException(Exception):
                pass

        def __init__(self) -> None:
            self.threads: list[int] = []

        def get_item(self, **_: Any) -> dict[str, Any]:
            self.threads.append(threading.get_ident())
            return {}

    double = Double()
    store = DynamoDBSessionStore("sessions", client=double, inline_reads_and_writes=True)
    with turn_deadline(time.monotonic() + 60):
        assert await store.load("s1") is None
    assert await store.load("s2") is None  # no deadline: nothing to abandon the call for
    assert double.threads[0] != threading.get_ident() and double.threads[1] == threading.get_ident()


async def test_a_conflict_raised_inline_is_the_same_conflict(moto_dynamodb: DynamoTable) -> None:
    from picoflow.errors import SessionConflictError

    store = moto_dynamodb.store(inline_reads_and_writes=True)
    doc = await store.create(FLOW)
    await store.save(doc, 0)
    with pytest.raises(SessionConflictError):
        await store.save(doc, 0)
    await store.close()


def test_the_lambda_runtime_builds_its_store_for_one_turn_at_a_time() -> None:
    env = {"SESSION_STORE": "DYNAMODB", "SESSION_TABLE": "sessions", "AWS_REGION": "eu-west-1"}
    assert store_from_env(env).inline_reads_and_writes is False  # type: ignore[attr-defined]
    engine = build_engine({**env, "PICOFLOW_FLOWS": "flows.basic"})
    assert isinstance(engine.session_store, DynamoDBSessionStore)
    assert engine.session_store.inline_reads_and_writes is True
