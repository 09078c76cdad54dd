"""Who is calling: the verified JWT claim that names the principal whose sessions and keys a request may use."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: The environment variable naming the claim; ``sub`` when unset.
PRINCIPAL_CLAIM_VARIABLE = "PICOFLOW_PRINCIPAL_CLAIM"
DEFAULT_PRINCIPAL_CLAIM = "sub"


def principal_claim() -> str:
    """The name of the claim that identifies a caller."""
    return os.environ.get(PRINCIPAL_CLAIM_VARIABLE) or DEFAULT_PRINCIPAL_CLAIM


def principal(claims: Mapping[str, Any] | None) -> str | None:
    """The principal named by verified ``claims``; None for an anonymous request."""
    value = (claims or {}).get(principal_claim())
    return str(value) if value else None
