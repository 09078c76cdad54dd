"""Carrying what a turn streams on the runtime's loop to the invocation's own thread, one item at a time, within
the invocation's time: the shared course of streamed ``POST /ai/run`` turns and of AG-UI runs."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from picoflow.aws.observability import logger
from picoflow.aws.runtime import Runtime

T = TypeVar("T")


@dataclass(frozen=True)
class Relay(Generic[T]):
    """How one run's items are relayed: the run's name in the logs, and its last item when it fails or overruns."""

    #: The run as the logs name it, e.g. "a streamed turn".
    run_name: str
    request_id: str
    #: The last item when the source raised: the client still learns how the run ended.
    failed: Callable[[Exception], T]
    #: The last item when the invocation is about to end first: the outcome is unknown (a save may be under way).
    overran: Callable[[], T]

    def relay(
        self, runtime: Runtime, source: Callable[[], AsyncIterator[T]], deliver: Callable[[T], Any], limit: float | None
    ) -> T:
        """Hand each item of ``source()`` (opened on the loop) to ``deliver`` from this thread as the loop produces it;
        return the last.

        Once ``deliver`` returns False the client is gone: later items are dropped but the run goes on to its end.
        When ``limit`` seconds pass first, the run is cancelled and ``overran()`` is the last item.
        """
        ends = None if limit is None else time.monotonic() + limit
        items: queue.SimpleQueue[T | None] = queue.SimpleQueue()  # None: the source has ended

        async def pump() -> None:
            try:
                async for item in source():
                    items.put(item)
            except Exception as exc:  # noqa: BLE001 - the client still gets a last item
                items.put(self.failed(exc))
            items.put(None)

        running = asyncio.run_coroutine_threadsafe(pump(), runtime.loop)
        listening, last = True, None
        while True:
            try:
                item = items.get(timeout=None if ends is None else max(ends - time.monotonic(), 0.0))
            except queue.Empty:
                running.cancel()
                logger.error(f"{self.run_name.capitalize()} overran the deadline", extra={"requestId": self.request_id})
                item = self.overran()
                if listening:
                    deliver(item)
                return item
            if item is None:
                if last is None:
                    raise RuntimeError(f"{self.run_name.capitalize()} ended without an item.")
                return last
            last = item
            if listening and deliver(item) is False:
                listening = False
                logger.info(f"Client left {self.run_name}; the turn goes on", extra={"requestId": self.request_id})
