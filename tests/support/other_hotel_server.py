"""Another hotel-pricing MCP server: ``search_hotels`` with the original contract over hotels of its own.

It shares no code with ``flows/hotel``: it filters on what it knows of its hotels but reports only the original
result (``hotelName``, ``prices`` per night, ``total``), none of the contract's optional details.
``python -m tests.support.other_hotel_server`` serves over stdio, ``--http --port N`` over streamable HTTP.
``OTHER_HOTEL_DAYS_PRICED`` changes how many days it prices: ``with-check-out`` prices the check-out day too (as the
original demo's server does: six prices for five nights, all in the total), ``one-short`` one day fewer.
"""

from __future__ import annotations

import argparse
import os
from datetime import date, timedelta

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

ROOM_RATES = {"one bed": 1.0, "two beds": 1.3, "suite": 1.9}
FRIDAY_AND_SATURDAY = 1.1
EVERYWHERE = {"freeWiFi", "freeParking", "nonSmoking"}
#: Name, nightly base rate, room types, amenities, miles to the airport and to the city center.
HOTELS = [
    ("Willamette Riverside Lodge", 95, ("one bed", "two beds", "suite"), EVERYWHERE | {"indoorPool"}, 9.5, 1.2),
    ("Pearl District Loft Hotel", 120, ("one bed", "two beds"), EVERYWHERE, 10.1, 0.4),
    ("Forest Park Inn", 88, ("one bed", "two beds"), EVERYWHERE | {"petFriendly"}, 13.0, 3.1),
    ("Alberta Arts Guesthouse", 101, ("one bed", "two beds"), EVERYWHERE, 7.2, 2.6),
    ("Burnside Bridge Hotel", 110, ("one bed", "two beds", "suite"), EVERYWHERE | {"fitnessCenter"}, 9.9, 0.7),
    ("Mount Tabor Suites", 92, ("two beds", "suite"), EVERYWHERE | {"kitchen"}, 8.4, 4.0),
    ("Sellwood Garden Inn", 99, ("one bed", "two beds"), EVERYWHERE, 12.6, 5.2),
    ("Hawthorne House Hotel", 105, ("one bed", "two beds"), EVERYWHERE, 9.0, 2.2),
    ("Laurelhurst Manor", 115, ("one bed", "two beds"), EVERYWHERE | {"freeBreakfast"}, 8.1, 3.0),
    ("Division Street Inn", 97, ("one bed", "two beds"), EVERYWHERE, 8.8, 3.5),
    ("Columbia Gorge Gateway", 130, ("one bed",), {"freeWiFi"}, 3.2, 11.0),
]


class Budget(BaseModel):
    min: float | None = None
    max: float | None = None


class MaxDistanceMiles(BaseModel):
    airport: float | None = None
    cityCenter: float | None = None


class Hotel(BaseModel):
    hotelName: str
    prices: list[float]
    total: float


class Found(BaseModel):
    hotels: list[Hotel]


server = MCPServer("other-hotel-pricing")


@server.tool()
def search_hotels(
    startDate: str,
    endDate: str,
    amenities: list[str],
    roomTypes: list[str],
    budget: Budget,
    maxDistanceMiles: MaxDistanceMiles,
) -> Found:
    """Hotels offering every amenity and room type, within the distances, each night priced within the budget."""
    start, end = date.fromisoformat(startDate), date.fromisoformat(endDate)
    extra = {"with-check-out": 1, "one-short": -1}.get(os.environ.get("OTHER_HOTEL_DAYS_PRICED", ""), 0)
    nights = [start + timedelta(days=n) for n in range((end - start).days + extra)]
    room = roomTypes[0] if roomTypes else "one bed"
    found = []
    for name, base, rooms, offered, airport, center in HOTELS:
        if not set(roomTypes) <= set(rooms) or not set(amenities) <= offered:
            continue
        if (maxDistanceMiles.airport is not None and airport > maxDistanceMiles.airport) or (
            maxDistanceMiles.cityCenter is not None and center > maxDistanceMiles.cityCenter
        ):
            continue
        prices = [
            round(base * ROOM_RATES[room] * (FRIDAY_AND_SATURDAY if night.weekday() in (4, 5) else 1.0), 2)
            for night in nights
        ]
        if all((budget.min or 0) <= price <= (budget.max or price) for price in prices):
            found.append(Hotel(hotelName=name, prices=prices, total=round(sum(prices), 2)))
    return Found(hotels=sorted(found, key=lambda hotel: (hotel.total, hotel.hotelName)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.port)
    else:
        server.run("stdio")
