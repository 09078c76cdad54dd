"""A bench for trying a flow: one engine, a scripted model, and a printed transcript of every turn.

``Bench(SomeFlow, replies)`` answers every model call from ``replies`` (see ``ScriptedProvider``) and keeps
sessions in memory, so a flow runs offline exactly as it would behind the HTTP API. ``await bench.say(text)``
runs one turn and prints it; ``replay(SomeFlow, "conversation.json")`` runs a whole scripted conversation (the
format ``make run`` replays). The tutorials run their flows on it::

    from picoflow.local.bench import Bench

    bench = Bench(GreetingFlow, [{"content": "Hello! What is your full name?"}])
    await bench.say("Hi")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from picoflow import Flow, FlowEngine, RunResponse
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore, SessionDoc


class Bench:
    """One conversation with ``flow``: every model call is answered by the next fitting reply of ``replies``."""

    def __init__(self, flow: type[Flow], replies: list[dict[str, Any]], config: dict[str, Any] | None = None) -> None:
        self.model = ScriptedProvider(replies)
        self.store = MemorySessionStore()
        self.engine = FlowEngine(
            flows=[flow], session_store=self.store, providers=ProviderRegistry(override=self.model)
        )
        self.flow_name = flow.id
        self.config = config
        self.session: str | None = None
        self.last: RunResponse | None = None

    async def say(self, message: str, *, quiet: bool = False) -> RunResponse:
        """Run one turn; print the user's message and the reply unless ``quiet``. A failed turn raises."""
        # The config travels with the first turn only: it becomes the session's context.
        config = self.config if self.session is None else None
        response = await self.engine.run(self.flow_name, message, session_id=self.session, config=config)
        if not response.success:
            raise RuntimeError(f"The turn failed with {response.error_code}: {response.detail}")
        self.session, self.last = response.session, response
        if not quiet:
            print(f"> {message}\n{response.message}")
        return response

    async def close(self) -> None:
        """Release what the engine holds open (MCP server sessions and subprocesses, store connections)."""
        await self.engine.close()

    async def document(self) -> SessionDoc:
        """The stored session document as it is after the last turn."""
        assert self.session is not None, "no turn has run yet"
        doc = await self.store.load(self.session)
        assert doc is not None, "the session is gone"
        return doc

    async def state(self, step: str) -> dict[str, Any]:
        """The durable state step ``step`` saved, read from the stored document, without bookkeeping keys (``_x``)."""
        steps = (await self.document()).flow.steps
        state = next((saved.state for saved in steps if saved.name == step), {})
        return {key: value for key, value in state.items() if not key.startswith("_")}

    async def current_step(self) -> str | None:
        """The step the session's cursor is on."""
        return (await self.document()).flow.current_step


async def replay(flow: type[Flow], path: str | Path, *, quiet: bool = False, turns: int | None = None) -> Bench:
    """Run the scripted conversation at ``path`` (a flow package's ``conversation.json``) and return its bench.

    ``turns`` stops after that many user turns. Raises when a turn fails or, for a whole conversation, when a
    scripted reply is left over: the script and the flow must agree.
    """
    conversation = json.loads(Path(path).read_text(encoding="utf-8"))
    played = conversation["turns"][:turns]
    replies = [reply for turn in played for reply in turn.get("replies", [])]
    bench = Bench(flow, replies, conversation.get("config"))
    for turn in played:
        await bench.say(turn["user"], quiet=quiet)
    if bench.model.remaining:
        raise RuntimeError(f"{bench.model.remaining} scripted replies were never used")
    return bench
