"""The city-temperature MCP server: ``get_city_temperatures`` for LA and NYC.

``python -m flows.basic.weather_mcp_server`` serves it over stdio; ``--http --port N`` over streamable HTTP at
``/mcp``. The SDK's server side is imported only by :func:`build_server` (flow discovery imports this module).
"""

from __future__ import annotations

from typing import Any

from flows.basic.weather_contract import TOOL, CityReading, Temperatures
from picoflow.local.tool_server import run_tool_server

_TEMPERATURES = {"LA": 72, "NYC": 83}


def get_city_temperatures(cities: list[str]) -> Temperatures:
    """Temperatures in degrees Fahrenheit for city abbreviations: LA and NYC are known, any other city is null."""
    return Temperatures(
        temperatures=[CityReading(city=city, temperature=_TEMPERATURES.get(city.strip().upper())) for city in cities]
    )


def build_server() -> Any:
    """The SDK's ``MCPServer`` with the ``get_city_temperatures`` tool."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("city-temperature", version="1.0.0")
    server.add_tool(get_city_temperatures, name=TOOL, annotations=ToolAnnotations(read_only_hint=True))
    return server


def main(argv: list[str] | None = None) -> None:
    """Serve over stdio, or over streamable HTTP with ``--http``."""
    run_tool_server(build_server, __doc__.splitlines()[0], port=8766, argv=argv)


if __name__ == "__main__":
    main()
