"""Checks the profile flow trusts instead of the model: plain functions, no framework, easy to unit test."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

# Letters, with inner apostrophes or hyphens: O'Brien, Jean-Luc.
_NAME_PART = re.compile(r"^[^\W\d_]+(?:['\-][^\W\d_]+)*$")


@dataclass(frozen=True)
class FullName:
    first: str
    last: str


def parse_full_name(text: str) -> FullName | None:
    """A first and a last name from ``text``, or None when it is not two or more name-like words."""
    parts = text.split()
    if len(parts) < 2 or not all(_NAME_PART.match(part) for part in parts):
        return None
    return FullName(first=parts[0], last=" ".join(parts[1:]))


def parse_birthday(text: str, today: date) -> date | None:
    """An ISO date (YYYY-MM-DD) that lies in the past and less than 130 years back, or None."""
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        return None
    return day if date(today.year - 130, 1, 1) <= day < today else None


def age_on(birthday: date, today: date) -> int:
    """Whole years from ``birthday`` to ``today``."""
    return today.year - birthday.year - ((today.month, today.day) < (birthday.month, birthday.day))
