"""Blocking calls (a boto3 request, a synchronous HTTP client) awaited without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

MAX_WORKERS = 64


async def run_blocking(call: Callable[[], Any]) -> Any:
    """Run ``call`` on a worker thread, in a copy of the caller's context, and await its result."""
    return await _CALLS.run(call)


class BlockingCalls:
    """Runs blocking client calls on worker threads, so a store or model call never blocks the event loop.

    What ``asyncio.to_thread`` does — the awaiting task leaves its loop free, the call runs in a copy of the
    caller's context, a call whose awaiter gave up (a deadline) still finishes on its thread — with less work
    per call than going through an executor: idle workers wait on one queue, a new worker starts only when
    every worker is busy (up to ``max_workers``; beyond it calls wait their turn), and the result comes back
    to the loop in one thread-safe callback.
    """

    def __init__(self, max_workers: int | None = None) -> None:
        # The calls wait on the network rather than compute, and a parallel fan-out may have dozens in flight.
        self.max_workers = max_workers or MAX_WORKERS
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._workers = 0
        self._idle = 0

    async def run(self, call: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._pid != os.getpid():
                self._reset()  # a forked child has none of its parent's threads
            if self._idle:
                self._idle -= 1
                start = False
            else:
                start = self._workers < self.max_workers
                self._workers += start
            self._queue.put((loop, future, call, contextvars.copy_context()))
        if start:
            threading.Thread(target=self._work, args=(self._queue,), name="picoflow-blocking", daemon=True).start()
        return await future

    def _work(self, calls: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        while True:
            loop, future, call, context = calls.get()
            try:
                outcome = (context.run(call), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, as an executor would
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed while the call ran: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, *outcome)
            del loop, future, call, context, outcome
            with self._lock:
                if calls is not self._queue:
                    return  # left over from before a fork
                self._idle += 1


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return  # the awaiting task gave up (cancelled, or timed out)
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


_CALLS = BlockingCalls()
