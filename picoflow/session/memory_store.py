"""A process-local session store for examples, unit tests and single-process development."""

from __future__ import annotations

import threading
import time
from typing import Any

from picoflow.errors import SessionConflictError, SessionTooLargeError
from picoflow.session.approvals import review_entries, still_waiting
from picoflow.session.document import FlowDoc, SessionDoc, decode_document, encode_document, new_document, prepare_write
from picoflow.session.journal import decode_outcome, encode_outcome, expiry
from picoflow.session.store import SessionStore


class MemorySessionStore(SessionStore):
    """Keeps encoded documents in a dict; nothing survives the process and nothing is shared with callers.

    Documents are held in their encoded form, so callers never share objects with the store and
    every load behaves like a load from a real backend.
    """

    def __init__(self, *, max_document_bytes: int | None = None) -> None:
        self.max_document_bytes = max_document_bytes
        # (revision, flow name, encoded document) per session id.
        self._rows: dict[str, tuple[int, str, bytes]] = {}
        # The effect journal: (expiry epoch second, encoded outcome) per key.
        self._effects: dict[str, tuple[int, bytes]] = {}
        # The owner of each owned session and journal entry, by session id and by key: the owner index.
        self._owners: dict[str, str] = {}
        self._effect_owners: dict[str, str] = {}
        # Calls waiting for a reviewer, per session: the index ``list_reviews`` reads.
        self._reviews: dict[str, list[dict[str, Any]]] = {}
        # A thread lock rather than an asyncio one: the critical sections never await, and callers
        # may also reach the store from worker threads.
        self._lock = threading.Lock()

    async def load(self, session_id: str) -> SessionDoc | None:
        with self._lock:
            row = self._rows.get(session_id)
        if row is None:
            return None
        return decode_document(row[2], row[0])

    async def create(
        self, flow: FlowDoc | dict[str, Any], *, session_id: str | None = None, owner: str | None = None
    ) -> SessionDoc:
        return self._put_new(new_document(flow, session_id, owner))

    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        written = prepare_write(doc, expected_revision)
        encoded = self._encode(written)
        with self._lock:
            row = self._rows.get(written.id)
            if row is None or row[0] != expected_revision or row[1] != written.flow.name:
                raise SessionConflictError(written.id)
            self._rows[written.id] = (written.revision, written.flow.name, encoded)
            self._index_reviews(written)
        return written

    async def insert(self, doc: SessionDoc) -> SessionDoc:
        return self._put_new(prepare_write(doc, 0))

    async def delete(self, session_id: str, expected_revision: int | None = None) -> None:
        with self._lock:
            row = self._rows.get(session_id)
            if expected_revision is not None and (row is None or row[0] != expected_revision):
                raise SessionConflictError(session_id)
            self._rows.pop(session_id, None)
            self._owners.pop(session_id, None)
            self._reviews.pop(session_id, None)

    async def load_effect(self, session_id: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._effects.get(key)
        if entry is None or entry[0] < time.time():
            return None
        return decode_outcome(entry[1])

    async def record_effect(
        self, session_id: str, key: str, outcome: dict[str, Any], *, owner: str | None = None
    ) -> bool:
        encoded = encode_outcome(outcome)
        now = time.time()
        with self._lock:
            held = self._effects.get(key)
            if held is not None and held[0] >= now:
                return False
            # Expired entries go as new ones arrive, so the journal stays as small as a day's effects.
            for stale in [k for k, (expires, _) in self._effects.items() if expires < now]:
                del self._effects[stale]
                self._effect_owners.pop(stale, None)
            self._effects[key] = (expiry(now), encoded)
            if owner:
                self._effect_owners[key] = owner
        return True

    async def list_reviews(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            reviews = [entry for entries in self._reviews.values() for entry in entries]
        return still_waiting(reviews, limit)

    async def delete_owner(self, owner: str) -> int:
        if not owner:
            raise ValueError("delete_owner needs a principal; anonymous sessions belong to nobody.")
        with self._lock:
            sessions = [session_id for session_id, held in self._owners.items() if held == owner]
            for session_id in sessions:
                del self._owners[session_id]
                self._rows.pop(session_id, None)
                self._reviews.pop(session_id, None)
            for key in [key for key, held in self._effect_owners.items() if held == owner]:
                del self._effect_owners[key]
                self._effects.pop(key, None)
        return len(sessions)

    def _put_new(self, doc: SessionDoc) -> SessionDoc:
        """Keep ``doc`` as a new row; ``SessionConflictError`` when a row already has its id."""
        encoded = self._encode(doc)
        with self._lock:
            if doc.id in self._rows:
                raise SessionConflictError(doc.id)
            self._rows[doc.id] = (doc.revision, doc.flow.name, encoded)
            if doc.owner:
                self._owners[doc.id] = doc.owner
            self._index_reviews(doc)
        return doc

    def _index_reviews(self, doc: SessionDoc) -> None:
        # Written with the row, under the same lock: the index never disagrees with the documents.
        entries = review_entries(doc)
        if entries:
            self._reviews[doc.id] = entries
        else:
            self._reviews.pop(doc.id, None)

    def _encode(self, doc: SessionDoc) -> bytes:
        encoded = encode_document(doc)
        if self.max_document_bytes is not None and len(encoded) > self.max_document_bytes:
            raise SessionTooLargeError(doc.id, len(encoded), self.max_document_bytes)
        return encoded
