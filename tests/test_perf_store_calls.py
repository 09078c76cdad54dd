"""The DynamoDB store's worker threads: results, errors, context, concurrency and abandoned calls."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from picoflow.threads import BlockingCalls

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


async def test_a_call_runs_off_the_loop_and_returns_its_result() -> None:
    calls = BlockingCalls()
    caller = threading.get_ident()
    ran_on = await calls.run(threading.get_ident)
    assert ran_on != caller
    assert await calls.run(lambda: {"Item": 1}) == {"Item": 1}


async def test_errors_reach_the_awaiting_task() -> None:
    calls = BlockingCalls()

    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await calls.run(fail)
    assert await calls.run(lambda: 2) == 2  # the worker survives


async def test_a_call_sees_a_copy_of_the_callers_context() -> None:
    calls = BlockingCalls()
    marker.set("turn-1")

    def read_and_change() -> str:
        seen = marker.get()
        marker.set("changed-in-thread")
        return seen

    assert await calls.run(read_and_change) == "turn-1"
    assert marker.get() == "turn-1"


async def test_concurrent_calls_run_in_parallel_up_to_the_limit() -> None:
    calls = BlockingCalls(max_workers=4)
    barrier = threading.Barrier(4, timeout=5)
    # Four calls that can only finish together: they must be on four threads at once.
    results = await asyncio.gather(*(calls.run(barrier.wait) for _ in range(4)))
    assert sorted(results) == [0, 1, 2, 3]
    # Beyond the limit, calls wait for a free worker instead of failing.
    assert await asyncio.gather(*(calls.run(lambda i=i: i) for i in range(12))) == list(range(12))
    assert calls._workers <= 4


async def test_an_abandoned_call_finishes_on_its_thread_and_later_calls_still_work() -> None:
    calls = BlockingCalls(max_workers=2)
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "late"

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(calls.run(slow), 0.01)
    assert finished.wait(2)
    assert await calls.run(lambda: "next") == "next"


def test_calls_from_several_event_loops_each_get_their_own_answer() -> None:
    calls = BlockingCalls(max_workers=3)
    answers: dict[int, list[int]] = {}

    def client_thread(number: int) -> None:
        async def turns() -> list[int]:
            return [await calls.run(lambda i=i: number * 100 + i) for i in range(20)]

        answers[number] = asyncio.run(turns())

    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {n: [n * 100 + i for i in range(20)] for n in range(4)}
