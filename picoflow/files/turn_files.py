"""The files of one turn: those attached to its message and the bytes already read, each fetched once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from picoflow.files.policy import DEFAULT_REQUEST_FILE_BYTES
from picoflow.files.refs import FileRef, digest_of
from picoflow.files.store import FileStore


class TurnFiles:
    """The files of one turn and a cache of file bytes, seeded with what the intake already read
    (and checked).

    ``read`` fetches a referenced file from ``store`` once per turn (an earlier turn's file too) and hands
    back None when it is gone or no longer has the referenced digest. ``budget`` bounds the file bytes one
    model request carries in full (``picoflow.files.reader``).
    """

    def __init__(
        self, store: FileStore | None, attached: Sequence[FileRef] = (), data: Mapping[str, bytes] | None = None,
        budget: int = DEFAULT_REQUEST_FILE_BYTES,
    ) -> None:
        self.store = store
        #: The files the user attached to this turn's message.
        self.attached: list[FileRef] = list(attached)
        self.budget = budget
        #: The ids of the files each (step, memory namespace) got in full during this turn.
        self.shown: dict[tuple[str, str], set[str]] = {}
        self._pending = list(attached)
        self._cache: dict[str, bytes | None] = dict(data or {})

    def take_attached(self) -> list[FileRef]:
        """The attached files, once: the first message built from the user's input carries them."""
        pending, self._pending = self._pending, []
        return pending

    def hold(self, ref: FileRef, data: bytes) -> None:
        """Serve ``data`` as ``ref`` for the rest of the turn (a file the server holds, not the file store)."""
        self._cache[ref.id] = data

    async def read(self, ref: FileRef) -> bytes | None:
        """The bytes of ``ref``, or None when the store no longer holds exactly them."""
        if ref.id not in self._cache:
            data = None if self.store is None else await self.store.read(ref.id, ref.size)
            self._cache[ref.id] = data if data is not None and digest_of(data) == ref.digest else None
        return self._cache[ref.id]
