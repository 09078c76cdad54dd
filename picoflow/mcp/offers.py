"""What a step offers the model from its MCP servers on one call, and how the model's call of an offered tool is
answered: its arguments checked against the server's schema, then the tool called through the engine's sessions.

Flow tools always win over server tools of the same name; a server that cannot list its tools is left out of
offers for a while; each problem is logged once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from picoflow.errors import PicoFlowError
from picoflow.logger import library_log
from picoflow.mcp.connections import MCPSessions
from picoflow.mcp.specs import (
    OFFER_RETRY_SECONDS,
    UNAVAILABLE_TOOL_FEEDBACK,
    MCPServerSpec,
    MCPToolResult,
    MCPTools,
    MCPUnavailableError,
)


@dataclass(frozen=True)
class OfferedTool:
    """A server tool a step offers: the allowlisting offer, and the server's description and input schema."""

    spec: MCPServerSpec
    offer: MCPTools
    name: str
    description: str
    input_schema: dict[str, Any]
    #: The engine's sessions the call goes through.
    sessions: MCPSessions = field(compare=False, repr=False)

    def as_model_tool(self) -> dict[str, Any]:
        """The OpenAI-style function description handed to ``bind_tools``: the server's own schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }

    def argument_problems(self, arguments: Mapping[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the server's input schema, or None when they do."""
        from jsonschema import exceptions, validators

        try:
            validator_class = validators.validator_for(self.input_schema)
            errors = sorted(validator_class(self.input_schema).iter_errors(dict(arguments)), key=str)
        except exceptions.SchemaError:
            # A schema the validator cannot read is the server's to enforce.
            return None
        if not errors:
            return None
        return "; ".join(f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}" for e in errors[:5])

    async def call(self, arguments: Mapping[str, Any]) -> MCPToolResult:
        """Call the tool; a failure comes back inside the result, for the step to handle or the model to be told."""
        try:
            return await self.sessions.call_tool(self.spec, self.name, arguments)
        except MCPUnavailableError as exc:
            return MCPToolResult(self.spec.name, self.name, dict(arguments), error=exc)




def find_server(servers: Sequence[MCPServerSpec], name: str, owner: str) -> MCPServerSpec:
    """The declaration named ``name`` among ``servers`` (a flow's), or a clear error."""
    for spec in servers:
        if spec.name == name:
            return spec
    raise PicoFlowError(f"MCP server '{name}' is not declared by flow '{owner}' (see define_mcp_servers()).")


@dataclass(frozen=True)
class ToolOffer:
    """What a step offers the model from its servers on this call: the tools, by name, and the allow-listed names
    left out because their server could not be asked (a call of one answers the fixed unavailable sentence)."""

    tools: dict[str, OfferedTool] = field(default_factory=dict)
    #: Tool name -> the declared server that could not list it.
    unavailable: dict[str, str] = field(default_factory=dict)

    def unavailable_outcome(self, name: str, arguments: Mapping[str, Any]) -> ToolCallOutcome:
        """The outcome of a call of a left-out tool: the fixed sentence, and a failed result for a handler."""
        error = MCPUnavailableError(self.unavailable[name], name, "unreachable")
        result = MCPToolResult(self.unavailable[name], name, dict(arguments), error=error)
        return ToolCallOutcome(UNAVAILABLE_TOOL_FEEDBACK, "error", result)


def _report(sessions: MCPSessions, message: str, spec: MCPServerSpec, tool: str) -> None:
    if not sessions.first_report((message, spec.connection_key(), tool)):
        return
    # A hostile server picks its tool names: the log keeps a bounded prefix.
    library_log.warning(message, extra={"mcpServer": spec.name, "mcpTool": tool[:64]})


async def _offer_listing(sessions: MCPSessions, spec: MCPServerSpec) -> dict[str, Any] | None:
    """The server's tools for an offer, or None when it cannot list them now (then not asked again for a while)."""
    if sessions.offer_paused(spec):
        return None
    try:
        listed = await sessions.list_tools(spec)
    except MCPUnavailableError as exc:
        library_log.warning("MCP server's tools left out of the offer",
                            extra={"mcpServer": spec.name, "reason": exc.reason})
        sessions.pause_offers(spec, OFFER_RETRY_SECONDS)
        return None
    sessions.pause_offers(spec, None)
    return listed


async def offered_tools(sessions: MCPSessions, flow: Any, offers: Sequence[MCPTools]) -> ToolOffer:
    """The server tools a step offers the model (its ``use_mcp_tools()``), with the servers' schemas.

    Connects lazily. Flow tools always win: a server tool named like one of the flow's own tools is left out, as
    are tools of a server that cannot list them, allow-listed tools the server does not list, and a second
    server's tool of a name already offered; each is logged, and the turn goes on with the rest.
    """
    offering = ToolOffer()
    for offer in offers:
        spec = flow.mcp_server(offer.server)
        listed = await _offer_listing(sessions, spec)
        names = list(offer.tools) if listed is None or not offer.all_tools else list(listed)
        for name in names:
            if flow.get_tool(name) is not None:
                _report(sessions, "MCP tool left out: the flow has a tool of that name", spec, name)
            elif name in offering.tools or name in offering.unavailable:
                _report(sessions, "MCP tool left out: another offered server has a tool of that name", spec, name)
            elif listed is None:
                offering.unavailable[name] = spec.name
            elif name not in listed:
                _report(sessions, "MCP server does not list an offered tool", spec, name)
                offering.unavailable[name] = spec.name
            else:
                listing = listed[name]
                offering.tools[name] = OfferedTool(spec, offer, name, listing.description or name,
                                                 dict(listing.input_schema), sessions)
    return offering


@dataclass
class ToolCallOutcome:
    """An offered tool's call as tool dispatch needs it: the content for the model, or what a handler gets."""

    content: str
    status: Literal["success", "error"] = "success"
    result: MCPToolResult | None = field(default=None)


async def run_offered(tool: OfferedTool, arguments: Mapping[str, Any]) -> ToolCallOutcome:
    """Check the model's arguments against the server's schema, then call the tool."""
    problems = tool.argument_problems(arguments)
    if problems is not None:
        retry = "Call the tool again with corrected arguments."
        return ToolCallOutcome(f"Invalid arguments for tool '{tool.name}': {problems}. {retry}", "error")
    result = await tool.call(arguments)
    return ToolCallOutcome(result.for_model(tool.offer.max_result_chars), "success" if result.ok else "error", result)
