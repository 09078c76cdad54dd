"""Markdown comparison tables, rendered in code so every number comes from data, not from a model.

A table shows what the search result says of each hotel. Where a server left a detail out, the search criteria
still vouch for part of it (every result offers the amenities and room type searched for, within the distance
limits); the rest is marked unknown and the table says which hotels it concerns.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

from .contract import ROOM_TYPES

FEATURES = ("price", "amenities", "room type", "distance")
YES, NO, UNKNOWN = "✅", "❌", "n/a"
#: The entry key each feature reads, for saying which hotels' servers left it out.
DETAIL = {"amenities": "amenities", "room type": "room_types", "distance": "distance"}


def money(amount: float) -> str:
    return f"${amount:,.2f}"


def miles(value: float) -> str:
    return f"{value:g} mi"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table whose columns are each padded to their own widest cell."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * width for width in widths]), *map(line, rows)])


def _offers(required: set[str], reported: list[str] | None, name: str) -> str:
    if name in required:
        return YES
    if reported is None:
        return UNKNOWN
    return YES if name in reported else NO


def _prices(entries: list[dict[str, Any]], criteria: dict[str, Any]) -> list[list[str]]:
    def night(entry: dict[str, Any], index: int) -> str:
        prices = entry["prices"]
        return money(prices[index]) if index < len(prices) else UNKNOWN

    rows = [
        [f"{date.fromisoformat(day):%a %m/%d}", *(night(entry, index) for entry in entries)]
        for index, day in enumerate(entries[0]["nights"])
    ]
    return [*rows, ["Total", *(money(entry["total"]) for entry in entries)]]


def _amenities(entries: list[dict[str, Any]], criteria: dict[str, Any]) -> list[list[str]]:
    required = set(criteria.get("amenities") or [])
    names = sorted(required.union(*(entry.get("amenities") or [] for entry in entries)))
    return [[name, *(_offers(required, entry.get("amenities"), name) for entry in entries)] for name in names]


def _room_types(entries: list[dict[str, Any]], criteria: dict[str, Any]) -> list[list[str]]:
    required = {criteria["room_type"]}
    reported = {room for entry in entries for room in entry.get("room_types") or []}
    rooms = [*ROOM_TYPES, *sorted(reported - set(ROOM_TYPES))]
    return [[room, *(_offers(required, entry.get("room_types"), room) for entry in entries)] for room in rooms]


def _distances(entries: list[dict[str, Any]], criteria: dict[str, Any]) -> list[list[str]]:
    def distance(entry: dict[str, Any], key: str, limit: float | None) -> str:
        value = (entry.get("distance") or {}).get(key)
        if value is not None:
            return miles(value)
        return f"within {miles(limit)}" if limit is not None else UNKNOWN

    return [
        [label, *(distance(entry, key, criteria.get(limit)) for entry in entries)]
        for label, key, limit in (
            ("Airport", "airport", "max_airport_miles"),
            ("City center", "cityCenter", "max_city_center_miles"),
        )
    ]


ROWS: dict[str, Callable[[list[dict[str, Any]], dict[str, Any]], list[list[str]]]] = {
    "price": _prices, "amenities": _amenities, "room type": _room_types, "distance": _distances,
}


def comparison(feature: str, entries: list[dict[str, Any]], criteria: dict[str, Any]) -> str:
    """Compare search results (``steps.search`` entries, found with ``criteria``) on one of ``FEATURES``."""
    rows = ROWS[feature](entries, criteria)
    if not rows:
        return f"The hotel search service does not report the {feature} of these hotels."
    rendered = table(["Feature", *(entry["hotel"] for entry in entries)], rows)
    unreported = [entry["hotel"] for entry in entries if feature in DETAIL and entry.get(DETAIL[feature]) is None]
    if unreported:
        rendered += (
            f"\n\nThe hotel search service did not report the {feature} of {', '.join(unreported)}: "
            "only what the search asked for is known."
        )
    return rendered
