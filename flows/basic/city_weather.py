"""A stand-in city temperature service and its client.

The service answers requests in the JSON-RPC ``tools/call`` shape an MCP server uses, in process, so the flow
runs offline. Swapping in a real transport changes ``_send`` only: the step sees plain ``CityTemperature``
values and never the protocol.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SUPPORTED_CITIES = ("LA", "NYC")

_TEMPERATURES = {"LA": 72, "NYC": 83}
_ALIASES = {
    "la": "LA",
    "l.a.": "LA",
    "los angeles": "LA",
    "nyc": "NYC",
    "new york": "NYC",
    "new york city": "NYC",
}


class WeatherServiceError(RuntimeError):
    """The temperature service refused a request or answered in an unexpected shape."""


@dataclass(frozen=True)
class CityTemperature:
    """One city's reading; ``temperature`` is ``None`` when the service does not know the city."""

    city: str
    temperature: int | None


def normalize_city(name: str) -> str:
    """Map the usual spellings of a supported city to its alias; anything else comes back tidied but unchanged."""
    tidy = " ".join(name.split())
    return _ALIASES.get(tidy.lower(), tidy)


def fetch_temperatures(cities: list[str]) -> list[CityTemperature]:
    """Ask the service for several cities in one request."""
    response = _send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "get_city_temperatures", "arguments": {"cities": cities}},
        }
    )
    if "error" in response:
        raise WeatherServiceError(str(response["error"].get("message")))
    # MCP wraps structured results as JSON text inside the first content part.
    parts = response.get("result", {}).get("content") or []
    text = parts[0].get("text") if parts else None
    if not isinstance(text, str):
        raise WeatherServiceError("The temperature service returned no text content.")
    readings = json.loads(text).get("temperatures")
    if not isinstance(readings, list):
        raise WeatherServiceError("The temperature service returned no temperatures.")
    return [CityTemperature(city=item["city"], temperature=item.get("temperature")) for item in readings]


def _send(request: dict[str, Any]) -> dict[str, Any]:
    return handle_request(request)


def handle_request(request: dict[str, Any]) -> dict[str, Any]:
    """The server side: answer one JSON-RPC request."""
    params = request.get("params") or {}
    if request.get("method") != "tools/call" or params.get("name") != "get_city_temperatures":
        return {"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32601, "message": "Method not found"}}
    cities = (params.get("arguments") or {}).get("cities") or []
    readings = [{"city": city, "temperature": _TEMPERATURES.get(str(city).strip().upper())} for city in cities]
    text = json.dumps({"temperatures": readings})
    return {"jsonrpc": "2.0", "id": request.get("id"), "result": {"content": [{"type": "text", "text": text}]}}
