"""The engine's flows as an MCP server: one tool per registered flow, over the official ``mcp`` SDK.

A tool is named after its flow and described by the flow's docstring. Its input is ``{message, session?,
approvals?}``: without ``session`` the call starts a conversation, with one it continues that conversation; its
structured output is ``FlowReply`` ``{message, session, completed, pendingApprovals}``. The session's owner is the
MCP caller's principal: a session that does not exist, or belongs to someone else, is a tool error, never another
user's conversation. A failed turn is a tool error whose text is the code and its fixed sentence.

``build_server`` makes a server for one caller (stateless: every request may reach another Lambda environment);
its ``streamable_http_app`` answers JSON, not a stream, so it runs behind the HTTP API.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field
from starlette.applications import Starlette

from picoflow.engine import FlowEngine
from picoflow.errors import public_message
from picoflow.results import wire_approval

__all__ = ["FlowReply", "MCP_PATH", "build_server", "flow_description", "http_app"]

MCP_PATH = "/mcp"
SERVER_NAME = "PicoFlow"
#: What a call naming a session it may not use is told (the same whether it is unknown or someone else's).
UNKNOWN_SESSION = "SESSION_NOT_FOUND"

T = TypeVar("T")
#: Runs a coroutine of the engine where the engine lives (its own event loop on Lambda); by default, here.
Submit = Callable[[Coroutine[Any, Any, T]], Awaitable[T]]


class Approval(BaseModel):
    """The caller's decision on a tool call waiting for approval (an id from ``pendingApprovals``)."""

    id: str = Field(min_length=1, max_length=128)
    approved: bool
    reason: str | None = Field(default=None, max_length=1000)


class FlowReply(BaseModel):
    """One turn's answer: the flow's reply, the session to continue with, and what waits for the caller."""

    message: str = Field(description="The flow's reply (JSON text when the step answers JSON).")
    session: str = Field(description="Pass it as session to continue this conversation.")
    completed: bool = Field(description="True when the conversation has ended; the next call starts a new one.")
    pendingApprovals: list[dict[str, Any]] = Field(  # noqa: N815 - the protocol's field name
        default_factory=list,
        description="Tool calls waiting for the caller's decision: answer them with approvals in the next call.",
    )


def flow_description(engine: FlowEngine, flow_name: str) -> str:
    """The flow's own docstring (its first paragraph), or a sentence naming it."""
    cls = engine.get_flow(flow_name)
    doc = (cls.__doc__ if cls is not None else None) or ""
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(first.split()) or f"Talk with the {flow_name} flow."


async def _here(coroutine: Coroutine[Any, Any, T]) -> T:
    return await coroutine


def build_server(
    engine: FlowEngine, *, caller: str | None, submit: Submit[Any] = _here, deadline: float | None = None,
    request_id: str | None = None,
) -> MCPServer:
    """An MCP server offering each of ``engine``'s flows as a tool, for the calls of ``caller``."""
    server: MCPServer = MCPServer(
        name=SERVER_NAME,
        # The SDK configures the root logger when nothing else has: only warnings, never a request's details.
        log_level="WARNING",
        instructions="Each tool is a conversation with one flow: pass the session it answers to continue it.",
    )
    for flow_name in engine.get_flow_names():
        server.add_tool(_flow_tool(engine, flow_name, caller, submit, deadline, request_id), name=flow_name,
                        description=flow_description(engine, flow_name), structured_output=True)
    return server


def http_app(server: MCPServer) -> Starlette:
    """The server's streamable HTTP app at ``/mcp``: stateless, answering JSON (no server-sent events).

    Host-header checks are off: the API in front (API Gateway and its authorizer, or ``picoflow serve`` on
    loopback) decides who reaches it.
    """
    return server.streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )


def _flow_tool(
    engine: FlowEngine, flow_name: str, caller: str | None, submit: Submit[Any], deadline: float | None,
    request_id: str | None,
) -> Callable[..., Awaitable[FlowReply]]:
    async def converse(message: str, session: str | None = None,
                       approvals: list[Approval] | None = None) -> FlowReply:
        if session:
            stored = await submit(engine.session_store.load(session))
            if stored is None or (stored.owner is not None and stored.owner != caller):
                raise ToolError(f"{UNKNOWN_SESSION}: {public_message(UNKNOWN_SESSION)}")
        decisions = [approval.model_dump(exclude_none=True) for approval in approvals or ()]
        extra: dict[str, Any] = {"approvals": decisions} if decisions else {}
        response = await submit(engine.run(
            flow_name, message, session or None, deadline=deadline, caller=caller, request_id=request_id, **extra,
        ))
        if not response.success:
            raise ToolError(f"{response.error_code}: {response.message}")
        text = response.message if isinstance(response.message, str) else json.dumps(response.message)
        return FlowReply(message=text, session=response.session, completed=response.completed,
                         pendingApprovals=[wire_approval(item) for item in response.pending_approvals])

    converse.__name__ = flow_name
    return converse
