"""McpFlow: a flow whose steps use the test MCP server (``tests/support/mcp_test_server.py``) every way there is.

The server is ``MCP_TEST_URL`` (streamable HTTP, its Authorization header from the SSM parameter named by
``MCP_TEST_AUTHORIZATION_PARAMETER`` when set), else ``MCP_TEST_COMMAND`` or the test server over stdio;
``MCP_TEST_TIMEOUT`` is its timeout.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, Transition, direct, stay, tool
from picoflow.mcp import MCPServerSpec, MCPToolResult, MCPTools, MCPUnavailableError

ROOT = str(Path(__file__).resolve().parents[2])


class Sum(BaseModel):
    total: int
    pid: int


class Numbers(BaseModel):
    a: int
    b: int


def server_spec() -> MCPServerSpec:
    timeout = float(os.environ.get("MCP_TEST_TIMEOUT") or 5)
    url = os.environ.get("MCP_TEST_URL")
    if url:
        parameter = os.environ.get("MCP_TEST_AUTHORIZATION_PARAMETER")
        ssm = {"Authorization": parameter} if parameter else None
        return MCPServerSpec.http("test", url, headers_from_ssm=ssm, timeout=timeout)
    command = shlex.split(os.environ.get("MCP_TEST_COMMAND") or "")
    command = command or [sys.executable, "-m", "tests.support.mcp_test_server"]
    return MCPServerSpec.stdio("test", command[0], command[1:], env={"PYTHONPATH": ROOT}, cwd=ROOT, timeout=timeout)


class OfferStep(Step):
    """Offers ``add``, ``fail``, ``slow`` and ``big`` to the model; the server answers them."""

    def get_prompt(self) -> str:
        return "Use the tools."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="test", tools=("add", "fail", "slow", "big"), max_result_chars=200)]


class HandledStep(Step):
    """Offers ``add`` and ``fail`` and handles both with its own handler, which gets the server's result."""

    def get_prompt(self) -> str:
        return "Use the tools."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="test", tools=("add", "fail"))]

    @tool
    async def add(self, result: MCPToolResult) -> Transition:
        total = result.parse(Sum).total
        self.save_state({"total": total})
        return direct(f"handled total {total}")

    @tool
    async def fail(self, result: MCPToolResult) -> Transition:
        return stay("handled failure" if not result.ok else "unexpected success")


class BackendStep(Step):
    """Its own typed tools call the server from the handler, the original's pattern."""

    def get_prompt(self) -> str:
        return "Use the tools."

    @tool
    async def sum_numbers(self, args: Numbers) -> Transition:
        """Add two numbers on the backend."""
        result = await self.flow.call_mcp_tool("test", "add", args, result_model=Sum)
        self.save_state({"total": result.total})
        return direct(f"backend total {result.total} from {result.pid}")

    @tool
    async def broken(self, args: Numbers) -> Transition:
        """Call the failing tool without catching its failure."""
        await self.flow.call_mcp_tool("test", "fail", {"reason": "x"})
        return direct("unreachable")

    @tool
    async def sluggish(self, args: Numbers) -> Transition:
        """Call the slow tool without catching its failure."""
        await self.flow.call_mcp_tool("test", "slow", {"seconds": args.a})
        return direct("unreachable")

    @tool
    async def guarded(self, args: Numbers) -> Transition:
        """Call the failing tool and handle its failure, as the original's search does."""
        try:
            await self.flow.call_mcp_tool("test", "fail", {"reason": "x"})
        except MCPUnavailableError:
            return stay("the service is unavailable, ask the user to retry")
        return direct("unreachable")


class McpFlow(Flow):
    """One step per way of using an MCP server; ``config.start`` picks where a session starts."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="test")

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        return [server_spec()]

    def define_steps(self) -> list[Step]:
        return [BackendStep(self), OfferStep(self), HandledStep(self)]

    def initial_step(self) -> Any:
        return self.get_context("config.start") or BackendStep
