"""Domain rules for the profile steps, as plain functions with no framework imports.

Each check returns the parsed value or raises ``InvalidInput`` whose message says what is wrong, so a tool
handler can pass the reason straight back to the model.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import date

PLACEHOLDER_NAMES = frozenset({"john doe", "jane doe"})

# The fifty states, DC and the inhabited territories.
US_STATES = frozenset(
    {
        "AL", "AK", "AZ", "AR", "CA", "CO", "CT", "DE", "FL", "GA", "HI", "ID", "IL", "IN", "IA", "KS", "KY", "LA",
        "ME", "MD", "MA", "MI", "MN", "MS", "MO", "MT", "NE", "NV", "NH", "NJ", "NM", "NY", "NC", "ND", "OH", "OK",
        "OR", "PA", "RI", "SC", "SD", "TN", "TX", "UT", "VT", "VA", "WA", "WV", "WI", "WY", "DC", "PR", "GU", "VI",
        "AS", "MP",
    }
)

_ZIP = r"(?P<zip>\d{5}(?:-\d{4})?)"
_STATE = r"(?P<state>[A-Za-z]{2})"
# "12 Main St, Springfield, IL 62701": commas between street, city and state.
_WITH_COMMAS = re.compile(rf"^(?P<street>[^,]+?)\s*,\s*(?P<city>[^,]+?)\s*,\s*{_STATE}\s+{_ZIP}$")
# "123 K St. Portland, OR 97006": no comma after the street, so a street suffix marks where it ends.
_STREET_SUFFIX = r"(?:street|st|road|rd|avenue|ave|boulevard|blvd|drive|dr|lane|ln|court|ct|way|place|pl)\b\.?"
_SUFFIX_ENDS_STREET = re.compile(
    rf"^(?P<street>.+?\b{_STREET_SUFFIX})\s+(?P<city>[^,]+?)\s*,\s*{_STATE}\s+{_ZIP}$", re.IGNORECASE
)
_STREET_SHAPE = re.compile(r"^\d+[A-Za-z]?\s+\S")
_CITY_SHAPE = re.compile(r"^[A-Za-z][A-Za-z .'-]*$")


class InvalidInput(ValueError):
    """User input that breaks a domain rule; the message is the reason."""


@dataclass(frozen=True)
class Address:
    """A parsed U.S. mailing address."""

    street: str
    city: str
    state: str
    zip: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def check_full_name(raw: str) -> str:
    """The name with its whitespace tidied; placeholder names are refused."""
    name = " ".join(raw.split())
    if not name:
        raise InvalidInput("The name is empty.")
    if name.lower() in PLACEHOLDER_NAMES:
        raise InvalidInput(f"Cannot accept {name}: it is a placeholder, not a real name.")
    return name


def check_birth_date(year: int, month: int, day: int, today: date | None = None) -> date:
    """The date of birth, if it exists on the calendar and is not in the future."""
    try:
        born = date(year, month, day)
    except ValueError as exc:
        raise InvalidInput(f"{month}/{day}/{year} is not a real calendar date.") from exc
    if born > (today or date.today()):
        raise InvalidInput(f"{month}/{day}/{year} is in the future.")
    return born


def parse_address(raw: str) -> Address:
    """Split an address typed on one line into street, city, state and ZIP, checking each part."""
    text = " ".join(raw.split())
    match = _WITH_COMMAS.match(text) or _SUFFIX_ENDS_STREET.match(text)
    if match is None:
        raise InvalidInput("The address must contain a street, a city, a two-letter state and a ZIP code.")
    street, city = match["street"].strip(), match["city"].strip()
    state = match["state"].upper()
    if not _STREET_SHAPE.match(street):
        raise InvalidInput(f"'{street}' does not look like a street address with a house number.")
    if not _CITY_SHAPE.match(city):
        raise InvalidInput(f"'{city}' does not look like a city name.")
    if state not in US_STATES:
        raise InvalidInput(f"'{state}' is not a U.S. state code.")
    return Address(street=street, city=city, state=state, zip=match["zip"])
