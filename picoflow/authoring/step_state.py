"""How a step reads and writes its own state: the durable keys saved with the session (``save_state``'s rules)
and the transient ones kept for one request."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from picoflow.conversation.state import SAVE_ON_KEY, TRANSIENT_KEY, deep_merge, read_path
from picoflow.session.document import format_timestamp


class StepState:
    """The state accessors of a step, over the two things its running session lends it: the live state and the
    record of which keys flow code wrote (a parallel worker refuses writes outside its own step)."""

    def _live_state(self) -> dict[str, Any]:
        """The step's live state in the running session; ``Step`` supplies it."""
        raise NotImplementedError

    def _note_write(self, fields: Sequence[str]) -> None:
        """Record that flow code writes ``fields`` of this step's state; ``Step`` supplies it."""
        raise NotImplementedError

    def save_state(self, data: dict[str, Any]) -> None:
        """Replace ``data``'s first key, deep-merge the rest, and stamp ``_saveOn``.

        The state is saved with the session at the end of the turn; an empty ``data`` changes nothing.

        Args:
            data: The keys to save; plain JSON values.

        Example:
            ```python
            self.save_state({"name": args.name})
            ```
        """
        if not data:
            return
        self._note_write(list(data))
        state = self._live_state()
        state.pop(next(iter(data)), None)
        deep_merge(state, data)
        state[SAVE_ON_KEY] = format_timestamp(datetime.now(UTC))

    def get_state(self, path: str | None = None) -> Any:
        """The whole durable state, or one dotted path in it.

        Args:
            path: A dotted path (``"address.city"``); None reads the whole state.

        Returns:
            The value at ``path`` (None when it is missing).

        Example:
            ```python
            first = self.get_state("first")
            ```
        """
        return read_path(self._live_state(), path)

    def remove_state(self, key: str) -> None:
        """Drop ``key`` from the durable state."""
        self._note_write([key])
        self._live_state().pop(key, None)

    def save_transient_state(self, data: dict[str, Any]) -> None:
        """Keep ``data`` for this request only; it is never persisted."""
        self._note_write([])
        deep_merge(self._live_state().setdefault(TRANSIENT_KEY, {}), data)

    def get_transient_state(self, path: str | None = None) -> Any:
        """The transient state kept for this request, or one dotted path in it."""
        return read_path(self._live_state().get(TRANSIENT_KEY, {}), path)
