"""A protocol's conversation id (AG-UI's ``threadId``, A2A's ``contextId``) as a PicoFlow session.

Clients of these protocols name a conversation themselves and keep naming it, while a session's id is the
server's. The conversation's first turn is therefore sent with an idempotency key made from the conversation id,
so the session it creates takes the id that key derives (``picoflow.session.receipts.first_turn_session_id``);
every later turn finds the session by deriving the id again. The caller is part of the derivation: another caller
naming the same conversation reaches another session, never this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from picoflow.engine import FlowEngine
from picoflow.session.receipts import first_turn_session_id

__all__ = ["Conversation", "conversation_key", "conversation_session", "open_conversation"]


def conversation_key(protocol: str, conversation_id: str) -> str:
    """The idempotency key of a conversation's first turn."""
    return f"{protocol}:{conversation_id}"


def conversation_session(protocol: str, conversation_id: str, caller: str | None) -> str:
    """The id of the session holding ``conversation_id`` of ``protocol`` for ``caller``."""
    return first_turn_session_id(conversation_key(protocol, conversation_id), caller or "")


@dataclass(frozen=True)
class Conversation:
    """How to run the next turn of a conversation: the session to continue (None: the first turn creates it),
    the turn's idempotency key, and whether the conversation has ended (completed or aborted)."""

    session_id: str | None
    key: str
    ended: bool = False


async def open_conversation(
    engine: FlowEngine, protocol: str, conversation_id: str, caller: str | None, turn_key: str
) -> Conversation:
    """The next turn of ``conversation_id``: ``turn_key`` keys it once the session exists (a retry of the same
    request is answered from its receipt); the first turn is keyed by the conversation itself."""
    session_id = conversation_session(protocol, conversation_id, caller)
    stored = await engine.session_store.load(session_id)
    if stored is None:
        return Conversation(None, conversation_key(protocol, conversation_id))
    return Conversation(session_id, f"{protocol}-turn:{turn_key}", ended=stored.run_status != "running")
