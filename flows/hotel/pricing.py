"""The bundled pricing server's nightly prices: the demo's month, holiday, room and weekend multipliers.

Prices are computed on calendar dates, from the ``YYYY-MM-DD`` text of the request, never on instants: the
same request gets the same prices whatever the process's time zone (``TZ``). They equal the original demo
server's when that one runs with ``TZ=UTC``; started in another zone, the original reads each date as the
evening before and prices that day instead, which is why an external server must be given ``TZ`` explicitly.

Every day from check-in to check-out is priced, check-out day included, as the original server does; the flow
charges the nights only (``booking.nightly_prices``).
"""

from __future__ import annotations

from datetime import date, timedelta

#: Multiplier of each calendar month.
MONTH = {1: 1.2, 2: 1.2, 3: 1.2, 4: 1.4, 5: 1.4, 6: 1.4, 7: 1.8, 8: 1.8, 9: 1.8, 10: 1.5, 11: 1.2, 12: 1.2}
#: Multiplier of the room type the request names first; any other (or none) prices at 1.
ROOM = {"two beds": 1.6, "suite": 2.5}
#: Saturdays and Sundays.
WEEKEND = 1.15
HOLIDAY = 1.2
#: The days priced as holidays in every year, as (month, day): the demo's 2025 holiday list as it computes it
#: (its "third Monday" rule lands on 15 January and 19 February, its "fourth Thursday" on 27 November, ...).
HOLIDAYS = frozenset({(1, 1), (1, 15), (2, 19), (5, 5), (7, 4), (9, 1), (10, 14), (11, 11), (11, 27), (12, 25)})


def priced_days(start: date, end: date) -> list[date]:
    """Every day from the earlier to the later date, both included."""
    first, last = min(start, end), max(start, end)
    return [first + timedelta(days=offset) for offset in range((last - first).days + 1)]


def day_price(base: float, room_type: str | None, day: date) -> float:
    """One day's price, unrounded; the multipliers are combined first, in the demo's order, then applied."""
    multiplier = MONTH[day.month] * (HOLIDAY if (day.month, day.day) in HOLIDAYS else 1)
    multiplier *= ROOM.get(room_type or "", 1)
    multiplier *= WEEKEND if day.weekday() >= 5 else 1
    return base * multiplier


def prices(base: float | None, room_type: str | None, start: date, end: date) -> list[float] | None:
    """The price of every day of the stay, or None when the hotel has no usable base price."""
    if not base or base <= 0:
        return None
    return [day_price(base, room_type, day) for day in priced_days(start, end)]
