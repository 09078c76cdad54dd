"""The session store contract shared by every backend, and the document encoding they share."""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from typing import Any

from pydantic_core import from_json

from picoflow.errors import SessionFlowInvariantError
from picoflow.session.document import FlowDoc, SessionDoc, utc_now

#: The key under which a stored item keeps what is not part of the portable document.
ITEM_KEY = "_item"


def new_session_id() -> str:
    """An unguessable session id: 128 random bits as 32 hex characters."""
    return secrets.token_hex(16)


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

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release connections and handles."""

    def stored_size(self, doc: SessionDoc) -> int:
        """Bytes ``doc`` would occupy in this backend (the engine uses it to keep documents small)."""
        return len(encode_document(doc))


def encode_document(doc: SessionDoc) -> bytes:
    """The compact UTF-8 JSON encoding of a document, with its item data under ``_item`` when it has any."""
    # ``model_dump_json(by_alias=True)`` as bytes, without its round trip through ``str``.
    encoded = doc.__pydantic_serializer__.to_json(doc, by_alias=True)
    extra = doc.item_data()
    if not extra:
        return encoded
    # Spliced rather than re-dumped: the document is encoded once, the small item part beside it.
    tail = json.dumps(extra, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return encoded[:-1] + b',"' + ITEM_KEY.encode("ascii") + b'":' + tail + b"}"


def decode_document(raw: bytes | str, revision: int) -> SessionDoc:
    """A stored document, at the revision its backend records (the backend's copy is authoritative)."""
    try:
        data = parse_json(raw)
    except ValueError as exc:
        raise SessionFlowInvariantError(f"Stored session is not valid JSON: {exc}") from exc
    extra = data.pop(ITEM_KEY, None) if isinstance(data, dict) else None
    doc = SessionDoc.from_stored(data)
    doc.revision = revision
    doc.load_item_data(extra)
    return doc


def parse_json(raw: bytes | str) -> Any:
    """``json.loads(raw)``, parsed by pydantic's faster parser whenever that one accepts the text.

    Where the two parsers accept a text they give the same values; for the few texts only ``json.loads``
    accepts (a byte order mark, a lone surrogate escape) or neither does, ``json.loads`` decides.
    """
    try:
        return from_json(raw)
    except ValueError:
        return json.loads(raw)


def new_document(flow: FlowDoc | dict[str, Any], session_id: str | None = None, owner: str | None = None) -> SessionDoc:
    """A fresh running document at revision 0 around ``flow``, checked against the one-flow invariant."""
    flow_doc = flow if isinstance(flow, FlowDoc) else _validate_flow(flow)
    now = utc_now()
    doc = SessionDoc(
        id=session_id or new_session_id(), revision=0, flow=flow_doc.model_copy(deep=True), created_on=now, save_on=now
    )
    doc.owner = owner
    doc.check_invariant()
    return doc


def prepare_write(doc: SessionDoc, expected_revision: int) -> SessionDoc:
    """Check the invariant and return the copy to persist at ``expected_revision + 1``.

    The copy is shallow: stores encode it at once, so it never outlives the caller's document.
    """
    doc.check_invariant()
    return doc.model_copy(update={"revision": expected_revision + 1, "save_on": utc_now()})


def _validate_flow(flow: dict[str, Any]) -> FlowDoc:
    from pydantic import ValidationError

    try:
        return FlowDoc.model_validate(flow)
    except ValidationError as exc:
        raise SessionFlowInvariantError(f"Invalid flow object: {exc.errors()[0].get('msg')}") from exc
