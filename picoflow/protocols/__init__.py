"""Open agent protocols over the engine: AG-UI (``agui``), an MCP server (``mcp_server``) and A2A (``a2a``).

Each module maps a protocol's request onto one turn of a flow and the turn's events onto the protocol's own; the
server keeps the conversation (a client's copy of the history never replaces it). The adapters (``picoflow.aws``,
``picoflow.local``) give them their routes and transports.
"""
