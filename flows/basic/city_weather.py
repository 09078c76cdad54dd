"""BasicFlow's client of the city-temperature MCP server (``flows/basic/weather_mcp_server.py``).

The step sees plain ``CityTemperature`` values and never the protocol; which server answers is BasicFlow's
declaration (``WEATHER_MCP_URL``, else ``WEATHER_MCP_COMMAND``, else the bundled server over stdio).
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.basic.weather_contract import TOOL, Temperatures
from picoflow.authoring.flow import Flow

SERVER = "weather"
SUPPORTED_CITIES = ("LA", "NYC")

_ALIASES = {
    "la": "LA",
    "l.a.": "LA",
    "los angeles": "LA",
    "nyc": "NYC",
    "new york": "NYC",
    "new york city": "NYC",
}


@dataclass(frozen=True)
class CityTemperature:
    """One city's reading; ``temperature`` is ``None`` when the service does not know the city."""

    city: str
    temperature: int | None


def normalize_city(name: str) -> str:
    """Map the usual spellings of a supported city to its alias; anything else comes back tidied but unchanged."""
    tidy = " ".join(name.split())
    return _ALIASES.get(tidy.lower(), tidy)


async def fetch_temperatures(flow: Flow, cities: list[str]) -> list[CityTemperature]:
    """Ask the service for several cities in one call; ``MCPUnavailableError`` when it cannot answer."""
    result = await flow.call_mcp_tool(SERVER, TOOL, {"cities": cities}, result_model=Temperatures)
    return [CityTemperature(city=reading.city, temperature=reading.temperature) for reading in result.temperatures]
