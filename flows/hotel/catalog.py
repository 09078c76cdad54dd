"""The bundled Portland hotel catalog behind the bundled hotel-pricing MCP server: its data and its search.

Server side only: HotelFlow knows hotels solely through the ``search_hotels`` contract (``contract.py``).
"""

from __future__ import annotations

import json
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from flows.hotel.contract import stay_nights
from flows.hotel.pricing import quote

DATA = Path(__file__).parent / "data" / "hotels.json"


@cache
def hotels() -> tuple[dict[str, Any], ...]:
    """The catalog, read once per process."""
    return tuple(json.loads(DATA.read_text(encoding="utf-8")))


def hotel(name: str) -> dict[str, Any]:
    return next(h for h in hotels() if h["name"] == name)


def _within(value: float, limit: float | None) -> bool:
    return limit is None or value <= limit


def matches(hotel: dict[str, Any], criteria: dict[str, Any]) -> bool:
    """Whether a hotel offers the room type and every amenity, within the distance limits."""
    nearby = hotel["nearby"]
    return (
        criteria["room_type"] in hotel["roomType"]
        and all(hotel["amenities"].get(name) for name in criteria.get("amenities") or [])
        and _within(nearby["airport"], criteria.get("max_airport_miles"))
        and _within(nearby["cityCenter"], criteria.get("max_city_center_miles"))
    )


def search(criteria: dict[str, Any]) -> list[dict[str, Any]]:
    """Priced matches whose every night fits the nightly budget, cheapest first.

    Each entry is ``{"hotel", "nights": [ISO dates], "prices": [per night], "total"}``.
    """
    if not criteria:
        return []
    start, end = date.fromisoformat(criteria["start"]), date.fromisoformat(criteria["end"])
    low, high = criteria.get("min_price") or 0, criteria.get("max_price")
    found = []
    for candidate in hotels():
        if not matches(candidate, criteria):
            continue
        prices = quote(candidate.get("level"), criteria["room_type"], start, end)
        if prices and all(low <= price and _within(price, high) for price in prices):
            nights = [night.isoformat() for night in stay_nights(start, end)]
            total = round(sum(prices), 2)
            found.append({"hotel": candidate["name"], "nights": nights, "prices": prices, "total": total})
    return sorted(found, key=lambda entry: (entry["total"], entry["hotel"]))
