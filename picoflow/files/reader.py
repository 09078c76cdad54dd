"""A turn's view of its files: the ones the user attached, and their bytes read at most once per turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from picoflow.files.refs import FileRef, digest_of
from picoflow.files.store import FileStore


class TurnFiles:
    """The files of one turn and a cache of file bytes, seeded with what the intake already read
    (and checked).

    ``read`` fetches a referenced file from ``store`` once per turn (an earlier turn's file too) and hands
    back None when it is gone or no longer has the referenced digest.
    """

    def __init__(
        self, store: FileStore | None, attached: Sequence[FileRef] = (), data: Mapping[str, bytes] | None = None
    ) -> None:
        self.store = store
        #: The files the user attached to this turn's message.
        self.attached: list[FileRef] = list(attached)
        self._pending = list(attached)
        self._cache: dict[str, bytes | None] = dict(data or {})

    def take_attached(self) -> list[FileRef]:
        """The attached files, once: the first message built from the user's input carries them."""
        pending, self._pending = self._pending, []
        return pending

    async def read(self, ref: FileRef) -> bytes | None:
        """The bytes of ``ref``, or None when the store no longer holds exactly them."""
        if ref.id not in self._cache:
            data = None if self.store is None else await self.store.read(ref.id, ref.size)
            self._cache[ref.id] = data if data is not None and digest_of(data) == ref.digest else None
        return self._cache[ref.id]
