"""HotelFlow, the transactional example: search, present, compare and book a hotel."""

from flows.hotel.flow import HotelFlow

__all__ = ["HotelFlow"]
