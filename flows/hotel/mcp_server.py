"""The hotel-pricing MCP server: ``search_hotels`` over the bundled Portland catalog.

``python -m hotel.mcp_server`` (for a package ``hotel``) serves it over stdio; ``--http --port N`` over
streamable HTTP at ``/mcp``.
The SDK's server side is imported only by :func:`build_server`: ``picoflow serve`` imports every module of a
flow package when it discovers flows, and must not pay for a server it never runs.
"""

from __future__ import annotations

from typing import Any

from picoflow.local.tool_server import run_tool_server

from . import catalog
from .contract import TOOL, Budget, DistanceMiles, HotelPrice, MaxDistanceMiles, SearchHotelsResult


def search_hotels(
    startDate: str,
    endDate: str,
    amenities: list[str],
    roomTypes: list[str],
    budget: Budget,
    maxDistanceMiles: MaxDistanceMiles,
) -> SearchHotelsResult:
    """Search the bundled Portland hotel catalog and calculate nightly and total prices for the requested stay.

    Hotels come in catalog order, each day of the stay priced (check-out day included); each hotel also
    carries its amenities, room types and distances, the contract's optional details.
    """
    request = {
        "startDate": startDate, "endDate": endDate, "amenities": amenities, "roomTypes": roomTypes,
        "budget": budget.model_dump(), "maxDistanceMiles": maxDistanceMiles.model_dump(),
    }
    hotels = []
    for entry in catalog.search(request):
        record = catalog.hotel(entry["hotelName"])
        hotels.append(HotelPrice(
            **entry,
            amenities=sorted(name for name, offered in record["amenities"].items() if offered),
            roomTypes=list(record["roomType"]), distanceMiles=DistanceMiles(**record["nearby"]),
        ))
    return SearchHotelsResult(hotels=hotels)


def build_server() -> Any:
    """The SDK's ``MCPServer`` with the ``search_hotels`` tool."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("hotel-pricing", version="1.0.0")
    server.add_tool(search_hotels, name=TOOL, annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    return server


def main(argv: list[str] | None = None) -> None:
    """Serve over stdio, or over streamable HTTP with ``--http``."""
    run_tool_server(build_server, __doc__.splitlines()[0], port=8765, argv=argv)


if __name__ == "__main__":
    main()
