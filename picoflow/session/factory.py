"""Store selection from the environment: ``SESSION_STORE`` names the backend.

Backends are imported inside the factory, so memory and SQLite users never load boto3.
"""

from __future__ import annotations

import os

from picoflow.errors import PicoFlowError
from picoflow.session.store import SessionStore


def store_from_env(env: dict[str, str] | None = None, *, one_turn_at_a_time: bool = False) -> SessionStore:
    """Build the store named by ``SESSION_STORE`` (MEMORY by default, SQLITE, DYNAMODB).

    ``one_turn_at_a_time``: the process runs one turn at a time (a Lambda function), so the DynamoDB store may
    send the session's read and write on the event loop's thread (``inline_reads_and_writes``).
    """
    env = dict(os.environ) if env is None else env
    kind = (env.get("SESSION_STORE") or "MEMORY").strip().upper()
    if kind == "MEMORY":
        from picoflow.session.memory_store import MemorySessionStore

        return MemorySessionStore()
    if kind == "SQLITE":
        from picoflow.session.sqlite_store import SQLiteSessionStore

        return SQLiteSessionStore(env.get("SQLITE_PATH") or "ignore/session/session.sqlite")
    if kind == "DYNAMODB":
        from picoflow.session.dynamodb_store import DynamoDBSessionStore

        table = env.get("SESSION_TABLE")
        if not table:
            raise PicoFlowError("SESSION_STORE=DYNAMODB needs SESSION_TABLE to name the sessions table.")
        ttl = env.get("SESSION_TTL_SECONDS")
        return DynamoDBSessionStore(
            table,
            endpoint_url=env.get("DYNAMODB_ENDPOINT_URL") or None,
            region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            ttl_seconds=int(ttl) if ttl else None,
            inline_reads_and_writes=one_turn_at_a_time,
        )
    raise PicoFlowError(f"No valid session store '{kind}'. Use MEMORY, SQLITE or DYNAMODB.")
