"""The effect journal: what an effect tool's handler did, kept by key so a retry of the turn replays it.

An effect tool (``@tool(effect=True)``, ``@tools([...], effect=True)``, ``ToolSpec(..., effect=True)``) changes
something outside the session. When its handler returns, the turn records the outcome (the transition or reply it
returned and the session state it changed, in stored form) under the call's key, in one conditional write of its
own, before the turn goes on. A later attempt of the same turn (by session id or by ``Idempotency-Key``, in any
process) reaches the same call with the same key and replays the outcome instead of calling the handler.

The key is ``effect_key(session id, revision, step, tool, arguments, ordinal)``:

* the session id and the revision the turn started from (a failed turn leaves the session at that revision, so a
  retry starts from it too; every committed turn moves it on, so a later turn gets new keys);
* the step that handles the call and the tool's name;
* the canonical JSON of the arguments as the tool's schema validated them (keys sorted, no spaces, UTF-8), so
  the model's wording of the same call (key order, ``1`` or ``1.0`` where the schema says float) does not matter;
* the ordinal of identical calls within the turn (0 for the first call of that step, tool and arguments, 1 for
  the second ...), so a turn that deliberately makes the same call twice journals both.

The model's tool-call ids take no part: a model gives every call a fresh id on every answer. The key is the first
32 hex characters of a SHA-256 over those parts. Entries expire after ``JOURNAL_TTL_SECONDS`` (24 hours): a
committed turn's entries are left to expire rather than deleted, so committing a turn stays one write.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from picoflow.deadline import before_deadline

if TYPE_CHECKING:
    from picoflow.session.store import SessionStore

#: How long a journal entry is kept: far longer than any client retries one turn.
JOURNAL_TTL_SECONDS = 24 * 3600


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON: keys sorted, no spaces, non-ASCII kept as UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def effect_key(session_id: str, revision: int, step_id: str, tool: str, args: Any, ordinal: int) -> str:
    """The journal key of one effect call (see the module's description); 32 hex characters."""
    parts = ["picoflow-effect", session_id, str(revision), step_id, tool, canonical_json(args), str(ordinal)]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:32]


def expiry(now: float | None = None) -> int:
    """The epoch second after which an entry written ``now`` may be dropped."""
    return int(time.time() if now is None else now) + JOURNAL_TTL_SECONDS


def encode_outcome(outcome: dict[str, Any]) -> bytes:
    return canonical_json(outcome).encode("utf-8")


def decode_outcome(raw: bytes | str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("a journal entry must hold a JSON object")
    return value


@dataclass
class TurnJournal:
    """One turn's access to the journal: its store, the session and revision it started from, and the count of
    identical effect calls made so far (for their ordinals)."""

    store: SessionStore
    session_id: str
    revision: int
    #: The session's principal, recorded with each entry so erasing the principal finds its entries.
    owner: str | None = None
    _seen: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def key(self, step_id: str, tool: str, args: Any) -> str:
        """The key of the next call of ``tool`` by ``step_id`` with ``args`` in this turn."""
        identity = (step_id, tool, canonical_json(args))
        ordinal = self._seen[identity]
        self._seen[identity] += 1
        return effect_key(self.session_id, self.revision, step_id, tool, args, ordinal)

    async def recorded(self, key: str) -> dict[str, Any] | None:
        """The outcome recorded under ``key``, or None; the store must answer before the turn's deadline."""
        return await before_deadline(self.store.load_effect(self.session_id, key))

    async def record(self, key: str, outcome: dict[str, Any]) -> None:
        """Record ``outcome`` under ``key`` (a key already recorded keeps its first outcome), before the turn's
        deadline."""
        await before_deadline(self.store.record_effect(self.session_id, key, outcome, owner=self.owner))
