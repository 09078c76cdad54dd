"""HotelFlow, the transactional example: search, present, compare and book a hotel.

``HotelFlow`` loads on first use, so the bundled MCP server (``python -m flows.hotel.mcp_server``) starts
without importing the flow and the framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows.hotel.flow import HotelFlow

__all__ = ["HotelFlow"]


def __getattr__(name: str) -> Any:
    if name == "HotelFlow":
        from flows.hotel.flow import HotelFlow

        return HotelFlow
    raise AttributeError(f"module 'flows.hotel' has no attribute {name!r}")
