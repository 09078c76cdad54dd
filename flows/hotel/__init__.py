"""HotelFlow, the transactional example: search, present, compare and book a hotel.

``HotelFlow`` loads on first use, so the package's MCP server (``python -m hotel.mcp_server`` for a package
``hotel``) starts without importing the flow and the framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .flow import HotelFlow

__all__ = ["HotelFlow"]


def __getattr__(name: str) -> Any:
    if name == "HotelFlow":
        from .flow import HotelFlow

        return HotelFlow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
