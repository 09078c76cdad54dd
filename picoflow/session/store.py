"""The session store contract every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from picoflow.errors import PicoFlowError
from picoflow.session.document import FlowDoc, SessionDoc, encode_document


class SessionStore(ABC):
    """Persists whole session documents with compare-and-swap on ``revision``.

    A store never interprets flows or applies restore policy: ``load`` returns whatever is stored.
    """

    #: Largest encoded document the backend accepts, in bytes; ``None`` means unbounded.
    max_document_bytes: int | None = None

    @abstractmethod
    async def load(self, session_id: str) -> SessionDoc | None:
        """Return the stored document, or ``None`` when there is none."""

    @abstractmethod
    async def create(
        self, flow: FlowDoc | dict[str, Any], *, session_id: str | None = None, owner: str | None = None
    ) -> SessionDoc:
        """Persist a new document around ``flow`` at revision 0 under ``session_id`` (default: a fresh id).

        ``owner`` records the principal the session belongs to. Raises ``SessionConflictError`` when a
        document already has that id.
        """

    @abstractmethod
    async def save(self, doc: SessionDoc, expected_revision: int) -> SessionDoc:
        """Write ``doc`` only if the stored revision equals ``expected_revision``.

        Returns a copy at ``expected_revision + 1``; raises ``SessionConflictError`` otherwise
        (a missing document is a conflict too).
        """

    async def insert(self, doc: SessionDoc) -> SessionDoc:
        """Persist a session's first turn: ``doc`` (never stored, revision 0) written at revision 1.

        Raises ``SessionConflictError`` when a document already has its id. Backends write it with one
        conditional write; this default, for backends that only implement the contract's other methods,
        creates the session and saves it (two writes).
        """
        await self.create(doc.flow, session_id=doc.id, owner=doc.owner)
        return await self.save(doc, 0)

    @abstractmethod
    async def delete(self, session_id: str, expected_revision: int | None = None) -> None:
        """Remove a document; compare-and-swap when ``expected_revision`` is given."""

    async def load_effect(self, session_id: str, key: str) -> dict[str, Any] | None:
        """The outcome an effect tool's call recorded under ``key`` for ``session_id`` (``picoflow.session.journal``),
        or None when there is none or it has expired. Backends that keep no journal refuse effect tools."""
        raise PicoFlowError(f"{type(self).__name__} keeps no effect journal, so it cannot serve effect tools.")

    async def record_effect(self, session_id: str, key: str, outcome: dict[str, Any]) -> bool:
        """Record ``outcome`` (a JSON object) under ``key`` with one conditional write, kept for
        ``JOURNAL_TTL_SECONDS``; False, and the first outcome kept, when ``key`` is already recorded."""
        raise PicoFlowError(f"{type(self).__name__} keeps no effect journal, so it cannot serve effect tools.")

    async def list_reviews(self, limit: int = 100) -> list[dict[str, Any]]:
        """The tool calls waiting for a reviewer, across sessions, oldest first (``review_entries``' form), read
        from an index the store keeps with each write, never by reading every session."""
        raise PicoFlowError(f"{type(self).__name__} keeps no index of calls waiting for a reviewer.")

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release connections and handles."""

    def stored_size(self, doc: SessionDoc) -> int:
        """Bytes ``doc`` would occupy in this backend (the engine uses it to keep documents small)."""
        return len(encode_document(doc))
