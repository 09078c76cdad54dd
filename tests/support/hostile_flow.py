"""HostileFlow: a flow whose steps use the hostile MCP server (``tests/support/hostile_mcp_server.py``).

The server is ``HOSTILE_URL`` (streamable HTTP), else the hostile server over stdio (its ``HOSTILE_*`` variables
passed through, ``HOSTILE_COMMAND`` replacing its command); ``HOSTILE_MAX_RESULT_BYTES`` caps its answers.
``config.start`` picks the step a session starts on.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, Transition, stay, tool
from picoflow.mcp import DEFAULT_MAX_RESULT_BYTES, MCPServerSpec, MCPTools, MCPUnavailableError

ROOT = str(Path(__file__).resolve().parents[2])


def hostile_spec() -> MCPServerSpec:
    limit = int(os.environ.get("HOSTILE_MAX_RESULT_BYTES") or DEFAULT_MAX_RESULT_BYTES)
    url = os.environ.get("HOSTILE_URL")
    if url:
        return MCPServerSpec.http("hostile", url, timeout=5, max_result_bytes=limit)
    command = shlex.split(os.environ.get("HOSTILE_COMMAND") or "")
    command = command or [sys.executable, "-m", "tests.support.hostile_mcp_server"]
    passed = [name for name in os.environ if name.startswith("HOSTILE_")]
    return MCPServerSpec.stdio("hostile", command[0], command[1:], env={"PYTHONPATH": ROOT}, inherit_env=passed,
                               cwd=ROOT, timeout=5, max_result_bytes=limit)


class Note(BaseModel):
    text: str


class Hotels(BaseModel):
    hotels: int


class NoteStep(Step):
    """Offers every tool of the server beside its own ``save_note``, which the server also lists."""

    def get_prompt(self) -> str:
        return "Take notes."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="hostile", all_tools=True)]

    @tool
    async def save_note(self, args: Note) -> Transition:
        """Save a note for the user."""
        self.save_state({"note": args.text})
        return stay("note saved by the flow")


class EchoStep(Step):
    """Offers the server's ``echo`` and ``where`` (an allow-list)."""

    def get_prompt(self) -> str:
        return "Echo."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="hostile", tools=("echo", "where", "flood"))]


class SearchStep(Step):
    """Its handler calls the server's ``flood`` as a backend."""

    def get_prompt(self) -> str:
        return "Search."

    @tool
    async def search(self, args: Hotels) -> Transition:
        """Search hotels."""
        try:
            found = await self.flow.call_mcp_tool("hostile", "flood", args.model_dump())
        except MCPUnavailableError as exc:
            return stay(f"search unavailable ({exc.reason})")
        return stay(f"{len(found['hotels'])} hotels found")


class HostileFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="test")

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        return [hostile_spec()]

    def define_steps(self) -> list[Step]:
        return [NoteStep(self), EchoStep(self), SearchStep(self)]

    def initial_step(self) -> Any:
        return self.get_context("config.start") or NoteStep


class ShadowingStep(Step):
    """Allow-lists a server tool named like the flow's own ``save_note``: refused when the flow is registered."""

    def get_prompt(self) -> str:
        return "Take notes."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="hostile", tools=("save_note",))]


class ShadowedFlow(HostileFlow):
    def define_steps(self) -> list[Step]:
        return [NoteStep(self), ShadowingStep(self)]
