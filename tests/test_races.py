"""Races on real DynamoDB semantics: concurrent turns on one session from separate processes.

Each worker process is a stand-alone Lambda container (``tests/support/race_worker.py``): it imports
``handlers.api`` with ``SESSION_STORE=DYNAMODB`` pointed at DynamoDB Local and a scripted model whose
reply takes ``MODEL_DELAY`` seconds, so turns released together by a barrier all read the same revision
and overlap in the model call. Only DynamoDB's conditional write decides who wins; no in-process lock
can help, which is the production situation behind API Gateway.
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from picoflow.errors import public_message
from picoflow.session.document import SessionDoc
from tests.support.dynamodb_local import DUMMY_AWS_ENV, DynamoTable, create_unique_table, local_client
from tests.support.race_worker import Task, init_worker, perform
from tests.support.tiny_flow import NAMESPACE

CONTENDERS = 8
ROUNDS = 3
# Long enough that every contender has read the session before the first one writes, even on a busy CI box.
MODEL_DELAY = 0.6
# Bounds every pool call, so a broken worker fails the test instead of hanging it.
CALL_TIMEOUT_SECONDS = 60


@pytest.fixture(scope="module")
def race_table(dynamodb_local: str) -> Iterator[DynamoTable]:
    client = local_client(dynamodb_local)
    table = create_unique_table(client, dynamodb_local, prefix="races")
    yield table
    client.delete_table(TableName=table.name)
    client.close()


@pytest.fixture(scope="module")
def workers(race_table: DynamoTable, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``CONTENDERS`` spawned worker processes, each a warmed-up Lambda container on ``race_table``."""
    script = tmp_path_factory.mktemp("races") / "script.json"
    # Every worker replays its own copy; 40 replies outlast every turn a worker serves in this module.
    script.write_text(json.dumps([{"content": f"ack {n}", "delay": MODEL_DELAY} for n in range(1, 41)]))
    env = {
        **DUMMY_AWS_ENV,
        "SESSION_STORE": "DYNAMODB",
        "SESSION_TABLE": race_table.name,
        "DYNAMODB_ENDPOINT_URL": str(race_table.endpoint_url),
        "PICOFLOW_SCRIPT": str(script),
        "PICOFLOW_FLOWS": "tests.support.tiny_flow",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "POWERTOOLS_METRICS_DISABLED": "true",
    }
    # spawn, not fork: each worker starts from a fresh interpreter like a separate Lambda container.
    context = multiprocessing.get_context("spawn")
    barriers = {"all": context.Barrier(CONTENDERS), "pair": context.Barrier(2)}
    pool = context.Pool(CONTENDERS, initializer=init_worker, initargs=(env, barriers))
    try:
        # Wait here until every worker is up, so start-up time is not charged to the first test.
        pings = run_all(pool, [Task("ping", barrier="all")] * CONTENDERS)
        assert len({ping["pid"] for ping in pings}) == CONTENDERS
        yield pool
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def run_all(pool: Any, tasks: list[Task]) -> list[dict[str, Any]]:
    # chunksize=1 and a barrier per task: every task blocks its worker until all have arrived, so the
    # tasks of one batch necessarily land on distinct workers.
    return pool.map_async(perform, tasks, chunksize=1).get(CALL_TIMEOUT_SECONDS)


def read_item(table: DynamoTable, session: str) -> dict[str, Any] | None:
    response = table.client.get_item(TableName=table.name, Key={"id": {"S": session}}, ConsistentRead=True)
    return response.get("Item")


def decode(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(zlib.decompress(item["doc"]["B"]))


def assert_whole(item: dict[str, Any]) -> dict[str, Any]:
    """The item is one complete write: the document validates and its scalar attributes agree with it."""
    doc = decode(item)
    SessionDoc.from_stored(doc)
    assert int(item["revision"]["N"]) == doc["revision"]
    assert item["flowName"]["S"] == doc["flow"]["name"] == "TinyFlow"
    assert item["runStatus"]["S"] == doc["runStatus"]
    assert item["saveOn"]["S"] == doc["saveOn"]
    return doc


def chat(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The conversation in the flow's namespace, without the system slot."""
    messages = doc["flow"]["memory"][NAMESPACE]["messages"]
    return [(m["type"], m["content"]) for m in messages if m["type"] in ("human", "ai")]


def open_session(pool: Any, opening: str) -> str:
    (result,) = run_all(pool, [Task("run", message=opening)])
    assert result["status"] == 200, result
    return result["body"]["session"]


def test_concurrent_turns_from_separate_processes_have_one_winner_per_revision(
    workers: Any, race_table: DynamoTable
) -> None:
    session = open_session(workers, f"opening {uuid.uuid4().hex[:8]}")
    start_revision = int(read_item(race_table, session)["revision"]["N"])
    rounds: list[dict[str, int]] = []

    for round_number in range(1, ROUNDS + 1):
        before = assert_whole(read_item(race_table, session))
        messages = [f"round {round_number} turn {n} {uuid.uuid4().hex[:8]}" for n in range(CONTENDERS)]
        results = run_all(workers, [Task("run", session, message, barrier="all") for message in messages])

        assert len({r["pid"] for r in results}) == CONTENDERS, "every contender must be its own process"
        by_revision: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for result in results:
            body = result["body"]
            # A winner reads the session exactly once. A loser reads it once more after its conditional
            # write failed, to learn whether that write was its own; a conflict never starts a fresh session.
            assert None not in result["loaded"], result
            assert body["session"] == session, result
            if result["status"] == 200:
                assert body["success"] is True
                assert len(result["loaded"]) == 1, result
            else:
                assert result["status"] == 409, result
                assert (body["code"], body["success"], body["completed"]) == ("SESSION_CONFLICT", False, False)
                assert body["message"] == public_message("SESSION_CONFLICT")
                # The read-back found a newer revision written by a winner.
                started_from, read_back = result["loaded"]
                assert read_back > started_from, result
            by_revision[result["loaded"][0]].append(result)

        # Exactly one winner per revision read, and the winners' revisions follow each other without gaps.
        winners = []
        for revision, group in sorted(by_revision.items()):
            group_winners = [r for r in group if r["status"] == 200]
            assert len(group_winners) == 1, f"revision {revision}: {[r['status'] for r in group]}"
            winners.append(group_winners[0])
        assert sorted(by_revision) == list(range(before["revision"], before["revision"] + len(winners)))
        # Contention really happened: at least one revision was read by several turns at once.
        assert max(len(group) for group in by_revision.values()) >= 2

        after_item = read_item(race_table, session)
        after = assert_whole(after_item)
        assert after["revision"] == before["revision"] + len(winners)
        # The winners' turns, in commit order, and nothing else: no lost update, no loser's message.
        expected = chat(before)
        for winner in winners:
            expected += [("human", winner["message"]), ("ai", winner["body"]["message"])]
        assert chat(after) == expected
        raw = zlib.decompress(after_item["doc"]["B"]).decode("utf-8")
        losers = [r for r in results if r["status"] == 409]
        assert not [r["message"] for r in losers if r["message"] in raw]
        # Losers did not mark the session aborted or log into it.
        assert after["runStatus"] == "running"
        assert after["error"] == before["error"] == []
        rounds.append({"winners": len(winners), "losers": len(losers), "largest_group": len(by_revision[
            before["revision"]])})

    final = assert_whole(read_item(race_table, session))
    assert final["revision"] == start_revision + sum(r["winners"] for r in rounds)
    print(f"\nrace rounds ({CONTENDERS} processes each): {rounds}; revision {start_revision} -> {final['revision']}")


# The rival of a turn is a delete. Each case fixes when the delete starts (after the shared barrier) and how
# long it pauses between its read and its conditional delete; the turn commits about MODEL_DELAY s in.
DELETE_CASES = {
    # Starts together with the turn: any consistent outcome is acceptable.
    "simultaneous": (0.0, 0.0, None),
    # The turn has read the session and is waiting on the model when the delete commits.
    "delete-first": (0.25, 0.0, "delete-won"),
    # The turn has long committed when the delete reads and removes the newer revision.
    "turn-first": (MODEL_DELAY + 0.9, 0.0, "turn-then-delete"),
    # The delete reads the old revision, the turn commits, then the delete's revision check fails.
    "delete-conflicts": (0.0, MODEL_DELAY + 0.6, "delete-conflicted"),
}


@pytest.mark.parametrize("case", list(DELETE_CASES))
def test_delete_racing_a_turn_leaves_a_consistent_store(workers: Any, race_table: DynamoTable, case: str) -> None:
    delete_delay, delete_pause, expected_outcome = DELETE_CASES[case]
    session = open_session(workers, f"opening {uuid.uuid4().hex[:8]}")
    before = assert_whole(read_item(race_table, session))
    message = f"racing the delete {uuid.uuid4().hex[:8]}"
    turn, end = run_all(
        workers,
        [
            Task("run", session, message, barrier="pair"),
            Task("end", session, barrier="pair", start_delay=delete_delay, delete_pause=delete_pause),
        ],
    )
    assert end["body"]["session"] == session
    item = read_item(race_table, session)

    if turn["status"] == 409:
        outcome = "delete-won"
        assert turn["body"]["code"] == "SESSION_CONFLICT" and turn["body"]["session"] == session
        assert end["status"] == 200 and end["body"]["success"] is True
        # The delete read the revision the turn started from, and nothing was written after it: the turn's
        # read-back after its failed conditional write found no item.
        assert end["loaded"] == [before["revision"]]
        assert turn["loaded"] == [before["revision"], None]
        assert item is None
    elif turn["status"] == 200 and turn["body"]["session"] != session:
        # The turn read after the delete: the id was unknown, so the turn began a new session under a new id.
        outcome = "delete-then-new-session"
        assert turn["loaded"] == [None] and end["status"] == 200
        assert item is None
        fresh = assert_whole(read_item(race_table, turn["body"]["session"]))
        assert chat(fresh) == [("human", message), ("ai", turn["body"]["message"])]
    elif turn["status"] == 200 and end["status"] == 200:
        outcome = "turn-then-delete"
        assert turn["loaded"] == [before["revision"]] and end["loaded"] == [before["revision"] + 1]
        assert item is None
    elif turn["status"] == 200:
        outcome = "delete-conflicted"
        # A delete that lost the revision check is a retryable conflict: 409 SESSION_DELETE_FAILED.
        assert end["status"] == 409, end
        assert end["body"]["code"] == "SESSION_DELETE_FAILED" and end["body"]["success"] is False
        assert end["body"]["message"] == public_message("SESSION_CONFLICT")
        assert end["loaded"] == [before["revision"]]
        after = assert_whole(item)
        assert after["revision"] == before["revision"] + 1 and after["runStatus"] == "running"
        assert chat(after) == chat(before) + [("human", message), ("ai", turn["body"]["message"])]
    else:
        pytest.fail(f"inconsistent outcome: turn {turn}, delete {end}")

    if expected_outcome is not None:
        assert outcome == expected_outcome
    print(f"\ndelete race '{case}': {outcome} (turn {turn['status']}, delete {end['status']})")
