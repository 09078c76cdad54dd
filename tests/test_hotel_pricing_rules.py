"""The bundled hotel-pricing server against the original demo's pricing rules, applied independently here.

The rules: a day's price is the hotel's base rate (its ``level``) x month x holiday x room x weekend, where the
month is 1.2 (January-March, November, December), 1.4 (April-June), 1.8 (July-September) or 1.5 (October), a
holiday 1.2, two beds 1.6 and a suite 2.5 (the first requested room type), Saturday and Sunday 1.15. Every day
from check-in to check-out inclusive is priced; a hotel is kept when it has every amenity, any requested room
type (all when none is asked), distances strictly under the limits, no day above a truthy ``budget.max`` and
none below a truthy ``budget.min``; hotels stay in catalog order and ``total`` is the sum of the days.
"""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flows.hotel import catalog
from flows.hotel.contract import AMENITIES, ROOM_TYPES

ROOT = Path(__file__).resolve().parents[1]
HOTELS = json.loads((ROOT / "flows/hotel/data/hotels.json").read_text(encoding="utf-8"))
MONTH = {**dict.fromkeys((1, 2, 3, 11, 12), Decimal("1.2")), **dict.fromkeys((4, 5, 6), Decimal("1.4")),
         **dict.fromkeys((7, 8, 9), Decimal("1.8")), 10: Decimal("1.5")}
ROOM = {"two beds": Decimal("1.6"), "suite": Decimal("2.5")}


def demo_holidays() -> set[tuple[int, int]]:
    """The demo's holiday days: fixed dates, plus its weekday rule evaluated for 2025 (Sunday = 0)."""
    days = {(1, 1), (7, 4), (11, 11), (12, 25)}
    for month, nth in ((1, 3), (2, 3), (5, 1), (9, 1), (10, 2), (11, 4)):
        first_weekday = (calendar.weekday(2025, month, 1) + 1) % 7
        days.add((month, 1 + (7 + nth - first_weekday) % 7 + (nth - 1) * 7))
    return days


HOLIDAYS = demo_holidays()


def expected_day(base: int, room: str | None, day: date) -> Decimal:
    factor = MONTH[day.month] * (Decimal("1.2") if (day.month, day.day) in HOLIDAYS else 1)
    return Decimal(base) * factor * ROOM.get(room or "", Decimal(1)) * (Decimal("1.15") if day.weekday() >= 5 else 1)


def expected(request: dict[str, Any]) -> list[tuple[str, list[Decimal]]]:
    start, end = sorted((date.fromisoformat(request["startDate"]), date.fromisoformat(request["endDate"])))
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    rooms, budget, limits = request["roomTypes"], request["budget"], request["maxDistanceMiles"]
    kept = []
    for hotel in HOTELS:
        if not all(hotel["amenities"].get(name) is True for name in request["amenities"]):
            continue
        if rooms and not set(rooms) & set(hotel["roomType"]):
            continue
        if any(limits[key] is not None and hotel["nearby"][key] >= limits[key] for key in ("airport", "cityCenter")):
            continue
        prices = [expected_day(hotel["level"], rooms[0] if rooms else None, day) for day in days]
        if (budget["max"] and max(prices) > Decimal(str(budget["max"]))) or (
                budget["min"] and min(prices) < Decimal(str(budget["min"]))):
            continue
        kept.append((hotel["name"], prices))
    return kept


def close(actual: float, exact: Decimal) -> bool:
    return abs(Decimal(actual) - exact) <= Decimal("1e-9") * max(exact, Decimal(1))


requests = st.fixed_dictionaries({
    "startDate": st.dates(date(2024, 1, 1), date(2028, 12, 31)).map(date.isoformat),
    "endDate": st.dates(date(2024, 1, 1), date(2028, 12, 31)).map(date.isoformat),
    "amenities": st.lists(st.sampled_from(AMENITIES), max_size=2, unique=True),
    "roomTypes": st.lists(st.sampled_from(ROOM_TYPES), max_size=2, unique=True),
    "budget": st.fixed_dictionaries({"min": st.sampled_from([None, 0, 150, 260.5]),
                                     "max": st.sampled_from([None, 0, 300, 520, 900])}),
    "maxDistanceMiles": st.fixed_dictionaries({"airport": st.sampled_from([None, 0, 3, 12, 12.4]),
                                               "cityCenter": st.sampled_from([None, 0.5, 8.5, 11])}),
}).filter(lambda r: abs((date.fromisoformat(r["endDate"]) - date.fromisoformat(r["startDate"])).days) <= 20)


@settings(max_examples=250, deadline=None)
@given(request=requests)
def test_the_server_applies_the_documented_rules(request: dict[str, Any]) -> None:
    limits = [Decimal(str(v)) for v in request["budget"].values() if v]
    everything = expected({**request, "budget": {"min": None, "max": None}})
    # Exact prices may straddle a budget limit by a rounding error; such requests say nothing about the rules.
    assume(not any(abs(p - limit) < Decimal("1e-6") for _, prices in everything for p in prices for limit in limits))
    found = catalog.search(request)
    wanted = expected(request)
    assert [entry["hotelName"] for entry in found] == [name for name, _ in wanted]
    for entry, (_, prices) in zip(found, wanted, strict=True):
        assert len(entry["prices"]) == len(prices)
        assert all(close(price, exact) for price, exact in zip(entry["prices"], prices, strict=True))
        assert close(entry["total"], sum(prices, Decimal(0)))


def test_the_issue_night_and_the_catalog_order() -> None:
    request = {"startDate": "2026-07-01", "endDate": "2026-07-06", "amenities": [], "roomTypes": ["two beds"],
               "budget": {"min": None, "max": None}, "maxDistanceMiles": {"airport": None, "cityCenter": None}}
    found = catalog.search(request)
    assert [entry["hotelName"] for entry in found] == [hotel["name"] for hotel in HOTELS]
    sherwood = next(entry for entry in found if entry["hotelName"] == "Hampton Inn Sherwood Portland")
    assert sherwood["prices"][:3] == [311.04, 311.04, 311.04] and len(sherwood["prices"]) == 6


@pytest.mark.parametrize("zone", ["America/Los_Angeles", "Pacific/Kiritimati", "UTC"])
def test_prices_do_not_depend_on_the_process_time_zone(zone: str, monkeypatch: pytest.MonkeyPatch) -> None:
    request = {"startDate": "2026-12-31", "endDate": "2027-01-02", "amenities": [], "roomTypes": ["suite"],
               "budget": {"min": None, "max": None}, "maxDistanceMiles": {"airport": None, "cityCenter": None}}
    reference = catalog.search(request)
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        assert catalog.search(request) == reference
        # And in a fresh process started in that zone, through the server's own entry point.
        probe = ("import json, sys; from flows.hotel.mcp_server import search_hotels; "
                 "from flows.hotel.contract import Budget, MaxDistanceMiles; "
                 "r = search_hotels('2026-12-31', '2027-01-02', [], ['suite'], Budget(), MaxDistanceMiles()); "
                 "print(json.dumps([[h.hotelName, h.prices, h.total] for h in r.hotels]))")
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**os.environ, "TZ": zone},
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert json.loads(out) == [[e["hotelName"], e["prices"], e["total"]] for e in reference]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_an_external_stdio_server_gets_the_process_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's server prices in its own zone: HotelFlow hands it the function's ``TZ`` (``:UTC`` on Lambda)."""
    from picoflow.mcp.environment import server_from_env
    from picoflow.mcp.transport import stdio_environment

    monkeypatch.delenv("HOTEL_MCP_URL", raising=False)
    monkeypatch.setenv("HOTEL_MCP_COMMAND", "node hotel-pricing-mcp-server.js")
    monkeypatch.setenv("HOTEL_MCP_INHERIT_ENV", "NODE_OPTIONS")
    monkeypatch.setenv("TZ", "UTC")
    spec = server_from_env("hotel", "HOTEL_MCP", "flows.hotel.mcp_server", timeout=10)
    assert spec.inherit_env == ("TZ", "NODE_OPTIONS")
    assert stdio_environment(spec)["TZ"] == "UTC"
