"""Blocking calls (a boto3 request, a synchronous HTTP client) awaited without blocking the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_blocking(call: Callable[[], T]) -> T:
    """Run ``call`` on a worker thread, in a copy of the caller's context, and await its result.

    This is ``asyncio.to_thread`` on the loop's default executor: the loop stays free, and a call whose awaiter
    gave up (a deadline) still finishes on its thread.
    """
    return await asyncio.to_thread(call)
