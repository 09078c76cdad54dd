"""Deterministic demo pricing: season, room, weekend and holiday multipliers over the nights of a stay."""

from __future__ import annotations

from datetime import date, timedelta
from functools import cache

from flows.hotel.contract import stay_nights

SEASON = {1: 0.9, 2: 0.9, 6: 1.2, 7: 1.3, 8: 1.25, 12: 1.1}
ROOM = {"one bed": 1.0, "two beds": 1.25, "suite": 1.6}
WEEKEND = 1.15  # Friday and Saturday nights
HOLIDAY = 1.3


def _weekday_of_month(year: int, month: int, weekday: int, nth: int) -> date:
    """The ``nth`` ``weekday`` (Monday = 0) of a month; ``nth = -1`` is the last one."""
    if nth > 0:
        first = date(year, month, 1)
        return first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (nth - 1))
    last = date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)
    return last - timedelta(days=(last.weekday() - weekday) % 7)


# New Year's Day, Juneteenth, Independence Day, Veterans Day, Christmas Day, as (month, day).
FIXED_HOLIDAYS = ((1, 1), (6, 19), (7, 4), (11, 11), (12, 25))
# Martin Luther King Jr., Presidents', Memorial, Labor, Columbus and Thanksgiving Days,
# as (month, weekday, nth); nth = -1 means the last one of the month.
FLOATING_HOLIDAYS = ((1, 0, 3), (2, 0, 3), (5, 0, -1), (9, 0, 1), (10, 0, 2), (11, 3, 4))


@cache
def holidays(year: int) -> frozenset[date]:
    """US federal holidays of ``year``.

    Floating holidays are computed for the year asked about: a fixture copied from one year
    puts Thanksgiving, Memorial Day and the rest on the wrong dates in every other year.
    """
    fixed = [date(year, month, day) for month, day in FIXED_HOLIDAYS]
    return frozenset(fixed + [_weekday_of_month(year, *rule) for rule in FLOATING_HOLIDAYS])


def nightly_price(base: float, room_type: str, night: date) -> float:
    """One night's price; weekend and holiday surcharges compound when both apply."""
    rate = base * ROOM[room_type] * SEASON.get(night.month, 1.0)
    if night.weekday() in (4, 5):
        rate *= WEEKEND
    if night in holidays(night.year):
        rate *= HOLIDAY
    return round(rate, 2)


def quote(base: float | None, room_type: str, start: date, end: date) -> list[float] | None:
    """Nightly prices for a stay, or None when there is nothing to price.

    The original guard (`!prices && prices.length > 0`) could never be true, so an empty stay or a
    hotel without a base price slipped through as a $0.00 match; here either one yields no quote.
    """
    nights = stay_nights(start, end)
    if not base or not nights:
        return None
    return [nightly_price(base, room_type, night) for night in nights]
