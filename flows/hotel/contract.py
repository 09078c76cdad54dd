"""The ``search_hotels`` contract of the hotel-pricing MCP server, shared by the server and HotelFlow."""

from __future__ import annotations

from pydantic import BaseModel, Field

SERVER = "hotel"
TOOL = "search_hotels"


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


class HotelPrice(BaseModel):
    hotelName: str
    prices: list[float] = Field(description="Price of each night of the stay, in USD")
    total: float


class SearchHotelsResult(BaseModel):
    hotels: list[HotelPrice]
