"""One attempt of a turn in a process of its own (a Lambda container), for the effect-timing proofs.

``run_attempt(task, answer_path)`` is the target of a process of its own (started from a fork server that has
imported this module, so an attempt starts in milliseconds); ``python -m tests.support.effect_worker '<task>'``
runs one from a shell. The task names the DynamoDB (Local) table, the session, the message, the client's
``Idempotency-Key`` (or null), the model script, the payments service, an optional turn deadline and an optional
crash point. The process writes the turn's answer as JSON, unless it
crashes first: at the chosen point it kills itself with SIGKILL.

Crash points: ``before_handler`` and ``after_downstream`` (in the handler, see ``effect_flows``),
``before_journal`` (the handler returned, the journal write not made), ``before_turn_write`` (the journal written,
the session not), ``before_answer`` (the session written, no answer sent). When ``marker`` names a file, it is
written as soon as the journal entry is, so a test can start a rival attempt at that moment.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import SessionDoc
from picoflow.session.dynamodb_store import DynamoDBSessionStore
from tests.support import effect_flows
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION


def faulty_store(task: dict[str, Any]) -> DynamoDBSessionStore:
    store = DynamoDBSessionStore(task["table"], endpoint_url=task["endpoint"], region_name=REGION)
    record_effect, save = store.record_effect, store.save
    marker = task.get("marker")

    async def recording(session_id: str, key: str, outcome: dict[str, Any], **options: Any) -> bool:
        effect_flows.crash_if("before_journal")
        written = await record_effect(session_id, key, outcome, **options)
        if marker:
            Path(marker).write_text("journaled", encoding="utf-8")
        effect_flows.crash_if("before_turn_write")
        return written

    async def saving(doc: SessionDoc, expected_revision: int) -> SessionDoc:
        saved = await save(doc, expected_revision)
        effect_flows.crash_if("before_answer")
        return saved

    store.record_effect = recording  # type: ignore[method-assign]
    store.save = saving  # type: ignore[method-assign]
    return store


async def attempt(task: dict[str, Any]) -> dict[str, Any]:
    effect_flows.PAYMENTS_URL = task["payments"]
    effect_flows.crash_at = task.get("crash")
    engine = FlowEngine(
        [effect_flows.RefundFlow],
        faulty_store(task),
        ProviderRegistry(override=ScriptedProvider(task["script"])),
        retry_delay=0,
    )
    seconds = task.get("deadline_seconds")
    response = await engine.run(
        "RefundFlow",
        task["message"],
        task["session"],
        deadline=None if seconds is None else time.monotonic() + seconds,
        idempotency_key=task.get("key"),
    )
    await engine.close()
    return {"status": response.status_code, "code": response.error_code, "message": response.message,
            "replayed": response.replayed}


def run_attempt(task: dict[str, Any], answer_path: str) -> None:
    """Run one attempt and write its answer to ``answer_path`` (nothing is written when it crashes)."""
    os.environ.update(DUMMY_AWS_ENV)
    Path(answer_path).write_text(json.dumps(asyncio.run(attempt(task))), encoding="utf-8")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(attempt(json.loads(sys.argv[1])))), flush=True)
