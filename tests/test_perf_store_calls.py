"""What the stores rely on from ``asyncio.to_thread`` for their blocking calls: results, errors, context,
concurrency and abandoned calls."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from asyncio import to_thread as run_blocking

import pytest

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


async def test_a_call_runs_off_the_loop_and_returns_its_result() -> None:
    caller = threading.get_ident()
    ran_on = await run_blocking(threading.get_ident)
    assert ran_on != caller
    assert await run_blocking(lambda: {"Item": 1}) == {"Item": 1}


async def test_errors_reach_the_awaiting_task() -> None:
    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await run_blocking(fail)
    assert await run_blocking(lambda: 2) == 2  # the worker survives


async def test_a_call_sees_a_copy_of_the_callers_context() -> None:
    marker.set("turn-1")

    def read_and_change() -> str:
        seen = marker.get()
        marker.set("changed-in-thread")
        return seen

    assert await run_blocking(read_and_change) == "turn-1"
    assert marker.get() == "turn-1"


async def test_concurrent_calls_run_in_parallel() -> None:
    barrier = threading.Barrier(4, timeout=5)
    # Four calls that can only finish together: they must be on four threads at once.
    results = await asyncio.gather(*(run_blocking(barrier.wait) for _ in range(4)))
    assert sorted(results) == [0, 1, 2, 3]
    # More calls than workers wait for a free worker instead of failing.
    assert await asyncio.gather(*(run_blocking(lambda i=i: i) for i in range(64))) == list(range(64))


async def test_an_abandoned_call_finishes_on_its_thread_and_later_calls_still_work() -> None:
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "late"

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_blocking(slow), 0.01)
    assert finished.wait(2)
    assert await run_blocking(lambda: "next") == "next"


def test_calls_from_several_event_loops_each_get_their_own_answer() -> None:
    answers: dict[int, list[int]] = {}

    def client_thread(number: int) -> None:
        async def turns() -> list[int]:
            return [await run_blocking(lambda i=i: number * 100 + i) for i in range(20)]

        answers[number] = asyncio.run(turns())

    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {n: [n * 100 + i for i in range(20)] for n in range(4)}
