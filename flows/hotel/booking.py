"""HotelFlow's own rules, independent of any search server: stay dates, choices from a result list, confirmations."""

from __future__ import annotations

import hashlib
from datetime import date
from typing import Any

MAX_NIGHTS = 30


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


def nightly_prices(prices: list[float], nights: int) -> list[float] | None:
    """The price of each night of a stay of ``nights`` nights, from a search server's price list; None if unusable.

    A list of one price per night is used as it is. The original demo's server also prices the check-out day (six
    prices for five nights): that last price is no night's and is dropped. A list of any other length cannot be
    matched to the nights, so the hotel cannot be offered.
    """
    if len(prices) == nights:
        return list(prices)
    if len(prices) == nights + 1:
        return list(prices[:nights])
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
