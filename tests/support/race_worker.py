"""Worker side of the cross-process race tests: each worker process is one Lambda container.

A worker imports ``handlers.api`` with the environment the test hands it (DynamoDB Local, a scripted
model with a delay, the tiny flow), warms the container up, and then serves ``perform`` calls: wait at a
shared barrier so every contender starts at the same instant, invoke the real Lambda handler with an
API Gateway event, and report the HTTP status, the body and the revision(s) the engine loaded.

The module is imported by spawned processes, so everything here must be importable and picklable.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

# Set by ``init_worker`` in each worker process.
_barriers: dict[str, Any] = {}
_loaded: list[int | None] = []
_loaded_lock = threading.Lock()
_delete_pause = 0.0

#: How long a contender waits for the others at a barrier before the round is declared broken.
BARRIER_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class Task:
    """One request for a worker: a turn (``run``), a session delete (``end``) or a readiness check (``ping``)."""

    kind: str
    session: str | None = None
    message: str | None = None
    #: Name of the barrier to wait at first (None: start at once).
    barrier: str | None = None
    #: Seconds to wait after the barrier, to order a request after its rival's first store call.
    start_delay: float = 0.0
    #: For ``end``: seconds to pause between the delete's load and its conditional delete.
    delete_pause: float = 0.0


def init_worker(env: dict[str, str], barriers: dict[str, Any]) -> None:
    """Pool initializer: configure the environment, import the handler and warm the container up."""
    global _barriers
    os.environ.update(env)
    _barriers = barriers

    import handlers.api as api
    from picoflow.aws.apigw import FakeLambdaContext, http_event
    from picoflow.aws.runtime import get_engine

    # A first request builds the engine and the DynamoDB client (a GetItem on an unknown id), so the
    # contended requests measure turns, not imports and connection set-up.
    warm = api.lambda_handler(
        http_event("POST", "/ai/end", headers={"CHAT_SESSION_ID": "warm-up"}), FakeLambdaContext()
    )
    if warm["statusCode"] != 404:  # nothing is stored under that id
        raise RuntimeError(f"worker warm-up failed: {warm}")

    store = get_engine().session_store
    original_load = store.load
    original_delete = store.delete

    async def recording_load(session_id: str) -> Any:
        # The revision each request started from is what tells winners and losers of one revision apart.
        doc = await original_load(session_id)
        with _loaded_lock:
            _loaded.append(None if doc is None else doc.revision)
        return doc

    async def pausing_delete(session_id: str, expected_revision: int | None = None) -> None:
        # Widens the gap between a delete's read and its conditional write, so a turn can commit in between.
        if _delete_pause:
            await asyncio.sleep(_delete_pause)
        await original_delete(session_id, expected_revision)

    store.load = recording_load  # type: ignore[method-assign]
    store.delete = pausing_delete  # type: ignore[method-assign]


def perform(task: Task) -> dict[str, Any]:
    """Run ``task`` through the Lambda handler and report what happened."""
    global _delete_pause
    import handlers.api as api
    from picoflow.aws.apigw import FakeLambdaContext, http_event

    if task.kind == "ping":
        # Reached only once the initializer has run: the worker is imported, warmed up and waiting.
        if task.barrier is not None:
            _barriers[task.barrier].wait(BARRIER_TIMEOUT_SECONDS)
        return {"kind": "ping", "pid": os.getpid()}
    headers = {"CHAT_SESSION_ID": task.session} if task.session else None
    if task.kind == "run":
        event = http_event("POST", "/ai/run", body={"flowName": "TinyFlow", "message": task.message}, headers=headers)
    elif task.kind == "end":
        event = http_event("POST", "/ai/end", headers=headers)
    else:
        raise ValueError(f"unknown task kind {task.kind!r}")
    _delete_pause = task.delete_pause
    with _loaded_lock:
        _loaded.clear()

    if task.barrier is not None:
        _barriers[task.barrier].wait(BARRIER_TIMEOUT_SECONDS)
    if task.start_delay:
        time.sleep(task.start_delay)
    started = time.time()
    result = api.lambda_handler(event, FakeLambdaContext(timeout_ms=25_000))
    finished = time.time()
    with _loaded_lock:
        loaded = list(_loaded)
    return {
        "kind": task.kind,
        "message": task.message,
        "status": result["statusCode"],
        "body": json.loads(result.get("body") or "null"),
        "loaded": loaded,
        "started": started,
        "finished": finished,
        "pid": os.getpid(),
    }
