"""The bundled Portland hotel catalog behind the bundled hotel-pricing MCP server: its data and its search.

Server side only: HotelFlow knows hotels solely through the ``search_hotels`` contract (``contract.py``).
"""

from __future__ import annotations

import json
import math
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from .pricing import prices

DATA = Path(__file__).parent / "data" / "hotels.json"


@cache
def hotels() -> tuple[dict[str, Any], ...]:
    """The catalog, read once per process."""
    return tuple(json.loads(DATA.read_text(encoding="utf-8")))


def hotel(name: str) -> dict[str, Any]:
    return next(h for h in hotels() if h["name"] == name)


def matches(hotel: dict[str, Any], amenities: list[str], room_types: list[str],
            airport: float | None, city_center: float | None) -> bool:
    """Whether a hotel offers every amenity and any of the room types, strictly within the distance limits."""
    nearby = hotel["nearby"]
    return (
        all(hotel["amenities"].get(name) is True for name in amenities)
        and (not room_types or any(room in hotel["roomType"] for room in room_types))
        and (airport is None or _distance(nearby.get("airport")) < airport)
        and (city_center is None or _distance(nearby.get("cityCenter")) < city_center)
    )


def search(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``search_hotels`` answer for a request of the contract: ``[{"hotelName", "prices", "total"}]``.

    Hotels come in catalog order. Every day of the stay is priced for the first requested room type; a hotel
    is left out when its dearest day is above ``budget.max`` or its cheapest below ``budget.min`` (a limit of
    0 or null is no limit).
    """
    start, end = _day(request["startDate"]), _day(request["endDate"])
    room_types = list(request.get("roomTypes") or [])
    budget = request.get("budget") or {}
    distance = request.get("maxDistanceMiles") or {}
    low, high = budget.get("min"), budget.get("max")
    found = []
    for candidate in hotels():
        if not matches(candidate, list(request.get("amenities") or []), room_types,
                       distance.get("airport"), distance.get("cityCenter")):
            continue
        daily = prices(candidate.get("level"), room_types[0] if room_types else None, start, end)
        if not daily or (high and max(daily) > high) or (low and min(daily) < low):
            continue
        total = 0.0
        for price in daily:  # summed in order, as the original does: float sums depend on it
            total += price
        found.append({"hotelName": candidate["name"], "prices": daily, "total": total})
    return found


def _distance(value: float | None) -> float:
    return math.inf if value is None else value


def _day(text: str) -> date:
    # A date, or the date part of a timestamp: prices depend on calendar days only.
    return date.fromisoformat(text[:10])
