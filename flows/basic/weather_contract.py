"""The ``get_city_temperatures`` contract of the city-temperature MCP server, shared by the server and BasicFlow.

Kept apart from the server module, so that running the server (``python -m flows.basic.weather_mcp_server``) does
not import it a second time through the flow package.
"""

from __future__ import annotations

from pydantic import BaseModel

TOOL = "get_city_temperatures"


class CityReading(BaseModel):
    city: str
    #: None when the service does not know the city.
    temperature: int | None


class Temperatures(BaseModel):
    temperatures: list[CityReading]
