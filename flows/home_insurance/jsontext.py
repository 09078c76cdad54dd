"""JSON text exactly as JavaScript's ``JSON.stringify`` writes it, for ids hashed from a record's JSON.

Python's ``json.dumps`` differs in numbers (``7000.0`` against ``7000``, ``1e-05`` against ``0.00001``),
in the order of integer-like object keys (JavaScript writes them first, ascending) and in lone surrogates;
an id hashed from the text must not depend on which language produced it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ARRAY_INDEX_LIMIT = 2**32 - 1


def js_stringify(value: Any) -> str:
    """``value`` (JSON data: dict, list, str, int, float, bool, None) as compact JavaScript JSON text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", json.dumps(value, ensure_ascii=False))
    if isinstance(value, Mapping):
        members = (f"{js_stringify(str(key))}:{js_stringify(value[key])}" for key in _js_key_order(value))
        return "{" + ",".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(js_stringify(item) for item in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON data")


def js_number(value: float) -> str:
    """A number as JavaScript prints it: shortest round-trip digits, exponent only outside 1e-7..1e21."""
    if isinstance(value, int):
        value = float(value) if abs(value) >= 10**21 else value
        if isinstance(value, int):
            return str(value)
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent_text = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # The decimal point's position relative to the first significant digit (ECMAScript's n).
    point = len(whole.lstrip("0")) if whole.strip("0") else -(len(fraction) - len(fraction.lstrip("0")))
    point += int(exponent_text or 0)
    digits = digits.rstrip("0") or "0"
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = point - 1
    mark = "+" if exponent >= 0 else "-"
    body = digits if count == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{body}e{mark}{abs(exponent)}"


def _js_key_order(mapping: Mapping[Any, Any]) -> list[Any]:
    indexes = [key for key in mapping if _is_array_index(str(key))]
    return sorted(indexes, key=lambda key: int(str(key))) + [key for key in mapping if not _is_array_index(str(key))]


def _is_array_index(key: str) -> bool:
    return key.isdigit() and key.isascii() and (key == "0" or not key.startswith("0")) and int(key) < _ARRAY_INDEX_LIMIT
