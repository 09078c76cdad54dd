"""A durable single-host session store on the standard library's sqlite3."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from picoflow.errors import PicoFlowError, SessionConflictError, SessionStoreError, SessionTooLargeError
from picoflow.session.approvals import review_entries, still_waiting
from picoflow.session.document import (
    FlowDoc,
    SessionDoc,
    decode_document,
    encode_document,
    format_timestamp,
    new_document,
    prepare_write,
)
from picoflow.session.journal import decode_outcome, encode_outcome, expiry
from picoflow.session.store import SessionStore

T = TypeVar("T")

DEFAULT_MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
BUSY_TIMEOUT_MS = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS session (
    id TEXT PRIMARY KEY,
    flow_name TEXT NOT NULL,
    revision INTEGER NOT NULL,
    run_status TEXT NOT NULL,
    save_on TEXT NOT NULL,
    doc TEXT NOT NULL,
    owner TEXT
)
"""
# Calls waiting for a reviewer, one row each, rewritten with their session's row in the same transaction.
_REVIEWS_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending_review (
    approval_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    entry TEXT NOT NULL
)
"""
_REVIEWS_INDEX = "CREATE INDEX IF NOT EXISTS pending_review_session ON pending_review (session_id)"
# The effect journal (picoflow.session.journal): one row per recorded effect call, dropped once expired.
_JOURNAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS effect_journal (
    key TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    owner TEXT
)
"""
# Erasure finds a principal's rows through these indexes (``delete_owner``), never by reading every row.
_OWNER_INDEXES = (
    "CREATE INDEX IF NOT EXISTS session_owner ON session (owner) WHERE owner IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS effect_journal_owner ON effect_journal (owner) WHERE owner IS NOT NULL",
)


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One transaction around a session's row and its reviewer index rows (the connection autocommits)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _index_reviews(conn: sqlite3.Connection, doc: SessionDoc) -> None:
    """Rewrite the reviewer index rows of ``doc`` (inside the transaction that writes its row)."""
    conn.execute("DELETE FROM pending_review WHERE session_id = ?", (doc.id,))
    conn.executemany(
        "INSERT OR REPLACE INTO pending_review (approval_id, session_id, created_at, entry) VALUES (?, ?, ?, ?)",
        [(entry["id"], doc.id, entry["createdAt"], json.dumps(entry, ensure_ascii=False))
         for entry in review_entries(doc)],
    )


class SQLiteSessionStore(SessionStore):
    """Stores one row per session in table ``session``; the ``revision`` column is the compare-and-swap token.

    The database runs in WAL mode with a busy timeout, so several connections and processes on one
    host can share the file. Blocking sqlite3 calls run in worker threads.
    """

    def __init__(self, path: str | Path, *, max_document_bytes: int | None = DEFAULT_MAX_DOCUMENT_BYTES) -> None:
        self.path = str(path)
        self.max_document_bytes = max_document_bytes
        self._conn: sqlite3.Connection | None = None
        # One connection per store, used from whichever worker thread runs the call.
        self._lock = threading.Lock()

    async def load(self, session_id: str) -> SessionDoc | None:
        def read(conn: sqlite3.Connection) -> tuple[int, str] | None:
            row: tuple[int, str] | None = conn.execute(
                "SELECT revision, doc FROM session WHERE id = ?", (session_id,)
            ).fetchone()
            return row

        row = await self._run("load", session_id, read)
        if row is None:
            return None
        return decode_document(row[1], row[0])

    async def create(
        self, flow: FlowDoc | dict[str, Any], *, session_id: str | None = None, owner: str | None = None
    ) -> SessionDoc:
        doc = new_document(flow, session_id, owner)
        if not await self._insert("create", doc):
            raise SessionConflictError(doc.id)
        return doc

    async def _insert(self, operation: str, doc: SessionDoc) -> bool:
        """Write ``doc`` as a new row; False when a row already has its id."""
        text = self._encode(doc)

        def insert(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO session (id, flow_name, revision, run_status, save_on, doc, owner) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (doc.id, doc.flow.name, doc.revision, doc.run_status, format_timestamp(doc.save_on), text, doc.owner),
            )
            if cursor.rowcount == 1:
                _index_reviews(conn, doc)
            return cursor.rowcount == 1

        return await self._run_in_transaction(operation, doc.id, insert)

    async def insert(self, doc: SessionDoc) -> SessionDoc:
        written = prepare_write(doc, 0)
        if not await self._insert("insert", written):
            raise SessionConflictError(written.id)
        return written

    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        written = prepare_write(doc, expected_revision)
        text = self._encode(written)

        def update(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(
                "UPDATE session SET revision = ?, run_status = ?, save_on = ?, doc = ? "
                "WHERE id = ? AND revision = ? AND flow_name = ?",
                (
                    written.revision,
                    written.run_status,
                    format_timestamp(written.save_on),
                    text,
                    written.id,
                    expected_revision,
                    written.flow.name,
                ),
            )
            if cursor.rowcount == 1:
                _index_reviews(conn, written)
            return cursor.rowcount

        if await self._run_in_transaction("save", written.id, update) != 1:
            raise SessionConflictError(written.id)
        return written

    async def delete(self, session_id: str, expected_revision: int | None = None) -> None:
        def remove(conn: sqlite3.Connection) -> int:
            if expected_revision is None:
                conn.execute("DELETE FROM session WHERE id = ?", (session_id,))
                conn.execute("DELETE FROM pending_review WHERE session_id = ?", (session_id,))
                return 1
            cursor = conn.execute("DELETE FROM session WHERE id = ? AND revision = ?", (session_id, expected_revision))
            if cursor.rowcount == 1:
                conn.execute("DELETE FROM pending_review WHERE session_id = ?", (session_id,))
            return cursor.rowcount

        if await self._run_in_transaction("delete", session_id, remove) != 1:
            raise SessionConflictError(session_id)

    async def load_effect(self, session_id: str, key: str) -> dict[str, Any] | None:
        def read(conn: sqlite3.Connection) -> tuple[str] | None:
            found: tuple[str] | None = conn.execute(
                "SELECT outcome FROM effect_journal WHERE key = ? AND expires_at >= ?", (key, int(time.time()))
            ).fetchone()
            return found

        row = await self._run("load_effect", session_id, read)
        return None if row is None else decode_outcome(row[0])

    async def record_effect(
        self, session_id: str, key: str, outcome: dict[str, Any], *, owner: str | None = None
    ) -> bool:
        text = encode_outcome(outcome).decode("utf-8")

        def insert(conn: sqlite3.Connection) -> bool:
            now = int(time.time())
            # Expired entries go as new ones arrive, so the journal stays as small as a day's effects.
            conn.execute("DELETE FROM effect_journal WHERE expires_at < ?", (now,))
            cursor = conn.execute(
                "INSERT OR IGNORE INTO effect_journal (key, session_id, expires_at, outcome, owner) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, session_id, expiry(now), text, owner or None),
            )
            return cursor.rowcount == 1

        return await self._run("record_effect", session_id, insert)

    async def list_reviews(self, limit: int = 100) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[tuple[str]]:
            rows: list[tuple[str]] = conn.execute(
                "SELECT entry FROM pending_review ORDER BY created_at LIMIT ?", (max(limit, 0) * 2 + 10,)
            ).fetchall()
            return rows

        rows = await self._run("list_reviews", "", read)
        return still_waiting((json.loads(row[0]) for row in rows), limit)

    async def delete_owner(self, owner: str) -> int:
        if not owner:
            raise ValueError("delete_owner needs a principal; anonymous sessions belong to nobody.")

        def remove(conn: sqlite3.Connection) -> int:
            # One transaction: the owner's sessions and journal entries go together or not at all.
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM effect_journal WHERE owner = ?", (owner,))
                conn.execute(
                    "DELETE FROM pending_review WHERE session_id IN (SELECT id FROM session WHERE owner = ?)", (owner,)
                )
                return conn.execute("DELETE FROM session WHERE owner = ?", (owner,)).rowcount

        return await self._run("delete_owner", "", remove)

    async def close(self) -> None:
        def shut() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(shut)

    def _encode(self, doc: SessionDoc) -> str:
        encoded = encode_document(doc)
        if self.max_document_bytes is not None and len(encoded) > self.max_document_bytes:
            raise SessionTooLargeError(doc.id, len(encoded), self.max_document_bytes)
        return encoded.decode("utf-8")

    async def _run_in_transaction(
        self, operation: str, session_id: str, work: Callable[[sqlite3.Connection], T]
    ) -> T:
        """``work`` inside one transaction (a session's row and its reviewer index rows change together)."""

        def transact(conn: sqlite3.Connection) -> T:
            with _transaction(conn):
                return work(conn)

        return await self._run(operation, session_id, transact)

    async def _run(self, operation: str, session_id: str, work: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return work(self._connection())

        try:
            return await asyncio.to_thread(call)
        except sqlite3.Error as exc:
            # A locked or busy database is transient; anything else is a real failure.
            transient = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc).lower()
            raise SessionStoreError(
                operation, session_id, f"{type(exc).__name__}: {exc}", status_code=503 if transient else 500
            ) from exc
        except OSError as exc:
            raise SessionStoreError(operation, session_id, f"{type(exc).__name__}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: every statement is its own atomic transaction, which is all the CAS needs.
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute(_SCHEMA)
                conn.execute(_JOURNAL_SCHEMA)
                conn.execute(_REVIEWS_SCHEMA)
                conn.execute(_REVIEWS_INDEX)
                _add_owner_columns(conn)
                for statement in _OWNER_INDEXES:
                    conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn


def _add_owner_columns(conn: sqlite3.Connection) -> None:
    """Bring a database written before erasure existed up to date: the ``owner`` columns, filled in for the
    sessions it already holds (each document records its owner)."""
    for table in ("session", "effect_journal"):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if "owner" in columns:
            continue
        conn.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT")
        if table == "session":
            for session_id, revision, text in conn.execute("SELECT id, revision, doc FROM session").fetchall():
                try:
                    owner = decode_document(text, revision).owner
                except (ValueError, PicoFlowError):  # unreadable: its own load fails, and it records no owner
                    continue
                if owner:
                    conn.execute("UPDATE session SET owner = ? WHERE id = ?", (owner, session_id))
