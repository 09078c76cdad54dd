"""The bundled Portland hotel catalog: search, choice resolution, date rules and confirmation numbers."""

from __future__ import annotations

import hashlib
import json
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from flows.hotel.pricing import quote, stay_nights

DATA = Path(__file__).parent / "data" / "hotels.json"
ROOM_TYPES = ("one bed", "two beds", "suite")
MAX_NIGHTS = 30


@cache
def hotels() -> tuple[dict[str, Any], ...]:
    """The catalog, read once per process."""
    return tuple(json.loads(DATA.read_text(encoding="utf-8")))


# The amenity vocabulary is the catalog's own keys, so the model can never pick one no hotel uses.
AMENITIES = tuple(sorted({key for hotel in hotels() for key in hotel["amenities"]}))


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


def date_problem(start: str, end: str, today: date) -> str | None:
    """Why a stay cannot be searched, or None when the dates are usable."""
    try:
        check_in, check_out = date.fromisoformat(start), date.fromisoformat(end)
    except ValueError:
        return "The stay dates must be real calendar dates in YYYY-MM-DD form. Ask the user for them again."
    if check_in <= today:
        return f"The check-in date must be after today ({today.isoformat()}). Ask the user for a later date."
    if check_out <= check_in:
        return "The check-out date must be after the check-in date. Ask the user to correct the stay dates."
    if (check_out - check_in).days > MAX_NIGHTS:
        return f"Stays are limited to {MAX_NIGHTS} nights. Ask the user for a shorter stay."
    return None


def pick(found: list[dict[str, Any]], refs: list[str]) -> list[dict[str, Any]] | None:
    """Resolve list numbers ("2", "#2") or names to result entries; None if any is unknown or repeated."""
    by_name = {entry["hotel"].casefold(): entry for entry in found}
    chosen: list[dict[str, Any]] = []
    for ref in refs:
        key = str(ref).strip().lstrip("#").strip()
        if key.isdigit():
            entry = found[int(key) - 1] if 0 < int(key) <= len(found) else None
        else:
            entry = by_name.get(key.casefold())
        if entry is None or entry in chosen:
            return None
        chosen.append(entry)
    return chosen or None


def confirmation_number(session_id: str, hotel_name: str) -> str:
    """A stable six-digit booking reference: a retried booking of the same hotel gets the same one."""
    digest = hashlib.sha256(f"{session_id}:{hotel_name}".encode()).hexdigest()
    return f"{int(digest[:12], 16) % 900_000 + 100_000}"
