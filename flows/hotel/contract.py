"""The ``search_hotels`` contract of the hotel-pricing MCP server, shared by the server and HotelFlow.

The original's result is ``{"hotels": [{"hotelName", "prices", "total"}]}``; a hotel may also carry the optional
details below (the bundled server fills them in). HotelFlow relies on nothing else, so any server that answers the
original contract serves it: the details it leaves out are compared as unknown.
"""

from __future__ import annotations

from datetime import date, timedelta

from pydantic import BaseModel, Field

SERVER = "hotel"
TOOL = "search_hotels"
#: The room types ``roomTypes`` speaks of.
ROOM_TYPES = ("one bed", "two beds", "suite")
#: The amenities ``amenities`` speaks of (a server may report others; HotelFlow asks only for these).
AMENITIES = (
    "airportShuttle", "boutique", "businessCenter", "concierge", "connectingRooms", "digitalKey", "evCharging",
    "eveningReception", "fitnessCenter", "freeBreakfast", "freeParking", "freeWiFi", "indoorPool", "kitchen",
    "meetingRoom", "newHotel", "nonSmoking", "onSiteRestaurant", "outdoorPool", "petFriendly", "roomService",
    "streaming", "tennis",
)


def stay_nights(start: date, end: date) -> list[date]:
    """The nights of a stay, which ``prices`` follow: check-in day up to, not including, check-out day."""
    return [start + timedelta(days=offset) for offset in range((end - start).days)]


class Budget(BaseModel):
    min: float | None = Field(None, description="Lowest acceptable nightly price in USD, or null")
    max: float | None = Field(None, description="Highest acceptable nightly price in USD, or null")


class MaxDistanceMiles(BaseModel):
    airport: float | None = Field(None, description="Largest distance to the airport in miles, or null")
    cityCenter: float | None = Field(None, description="Largest distance to the city center in miles, or null")


class SearchHotelsRequest(BaseModel):
    startDate: str = Field(description="Check-in date, YYYY-MM-DD")
    endDate: str = Field(description="Check-out date, YYYY-MM-DD")
    amenities: list[str] = Field(description="Amenities every hotel must offer")
    roomTypes: list[str] = Field(description="Room types every hotel must offer; prices are for the first")
    budget: Budget
    maxDistanceMiles: MaxDistanceMiles


class DistanceMiles(BaseModel):
    airport: float | None = Field(None, description="Distance to the airport in miles, or null when unknown")
    cityCenter: float | None = Field(None, description="Distance to the city center in miles, or null when unknown")


class HotelPrice(BaseModel):
    hotelName: str
    prices: list[float] = Field(
        description="Price of each night of the stay in USD; a server may add the check-out day, as the original does"
    )
    total: float
    # Optional details beyond the original contract: a server that knows none of them leaves them out.
    amenities: list[str] | None = Field(None, description="Every amenity the hotel offers, or null when unknown")
    roomTypes: list[str] | None = Field(None, description="Every room type the hotel offers, or null when unknown")
    distanceMiles: DistanceMiles | None = Field(None, description="The hotel's distances, or null when unknown")


class SearchHotelsResult(BaseModel):
    hotels: list[HotelPrice]
