"""Tools from MCP servers, on the official ``mcp`` SDK: declarations (``specs``), the engine's shared sessions and
bounded calls (``connections``, over the bounded transports of ``transport``), and tool offers (``offers``).

A flow declares its servers once (``Flow.define_mcp_servers``) as ``MCPServerSpec.http(...)`` (streamable HTTP,
the deployed case) or ``MCPServerSpec.stdio(...)`` (a local subprocess). Nothing connects until a step or a
handler needs a server; the session then stays open, held by a task of its own on the running event loop, and
later turns of the same engine on that loop reuse it (the engine's ``MCPSessions``, closed by
``FlowEngine.close``). A call over a reused session that finds it gone reconnects once.

Every call is bounded by the server's timeout and by the turn's deadline. A tool error (``isError``), an
unreachable server and a timeout all raise ``MCPUnavailableError``: a handler may catch it; otherwise the turn
fails as a transient outage (code ``MCP_UNAVAILABLE``, 503, session unchanged). Nothing the server says, nor its
URL or headers, goes into the error's message or the log.

An HTTP server's headers come from the environment or from SSM parameters (decrypted, read at the first connect
and kept for the container's life), or from a callable; they are never logged.

The SDK is imported only when a server is first used, so flows without MCP never load it.
"""

from picoflow.mcp.connections import MCPSessions
from picoflow.mcp.offers import OfferedTool, ToolCallOutcome, ToolOffer, find_server, offered_tools, run_offered
from picoflow.mcp.specs import (
    DEADLINE_RESERVE_SECONDS,
    DEFAULT_MAX_DESCRIPTION_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_RESULT_CHARS,
    DEFAULT_MAX_TOOLS,
    DEFAULT_TIMEOUT_SECONDS,
    OFFER_RETRY_SECONDS,
    UNAVAILABLE_TOOL_FEEDBACK,
    M,
    MCPServerSpec,
    MCPToolResult,
    MCPTools,
    MCPUnavailableError,
    Reason,
    cap,
    ssm_parameter,
)

__all__ = [
    "DEADLINE_RESERVE_SECONDS",
    "DEFAULT_MAX_DESCRIPTION_BYTES",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_MAX_RESULT_CHARS",
    "DEFAULT_MAX_TOOLS",
    "DEFAULT_TIMEOUT_SECONDS",
    "OFFER_RETRY_SECONDS",
    "UNAVAILABLE_TOOL_FEEDBACK",
    "M",
    "MCPServerSpec",
    "MCPSessions",
    "MCPToolResult",
    "MCPTools",
    "MCPUnavailableError",
    "OfferedTool",
    "Reason",
    "ToolCallOutcome",
    "ToolOffer",
    "cap",
    "find_server",
    "offered_tools",
    "run_offered",
    "ssm_parameter",
]
