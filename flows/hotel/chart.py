"""Markdown comparison tables, rendered in code so every number comes from data, not from a model."""

from __future__ import annotations

from datetime import date
from typing import Any

from flows.hotel.catalog import AMENITIES, ROOM_TYPES, hotel

FEATURES = ("price", "amenities", "room type", "distance")
YES, NO = "✅", "❌"


def money(amount: float) -> str:
    return f"${amount:,.2f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table whose columns are each padded to their own widest cell."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * width for width in widths]), *map(line, rows)])


def comparison(feature: str, entries: list[dict[str, Any]]) -> str:
    """Compare search results (see ``catalog.search``) on one of ``FEATURES``."""
    records = [hotel(entry["hotel"]) for entry in entries]
    if feature == "price":
        rows = [
            [f"{date.fromisoformat(night):%a %m/%d}", *(money(entry["prices"][index]) for entry in entries)]
            for index, night in enumerate(entries[0]["nights"])
        ]
        rows.append(["Total", *(money(entry["total"]) for entry in entries)])
    elif feature == "amenities":
        offered = [name for name in AMENITIES if any(record["amenities"].get(name) for record in records)]
        rows = [[name, *(YES if record["amenities"].get(name) else NO for record in records)] for name in offered]
    elif feature == "room type":
        rows = [[room, *(YES if room in record["roomType"] else NO for record in records)] for room in ROOM_TYPES]
    else:
        rows = [
            [label, *(f"{record['nearby'][key]} mi" for record in records)]
            for label, key in (("Airport", "airport"), ("City center", "cityCenter"))
        ]
    return table(["Feature", *(entry["hotel"] for entry in entries)], rows)
