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


#: The environment variable naming the group whose members decide calls waiting for a reviewer.
REVIEWER_GROUP_VARIABLE = "PICOFLOW_REVIEWER_GROUP"
#: The claims that may list a caller's groups: Cognito's, then the common one.
GROUP_CLAIMS = ("cognito:groups", "groups")


def groups(claims: Mapping[str, Any] | None) -> set[str]:
    """The groups verified ``claims`` list. API Gateway passes a JWT's array claim as text (``[a b]``)."""
    found: set[str] = set()
    for name in GROUP_CLAIMS:
        value = (claims or {}).get(name)
        if isinstance(value, (list, tuple)):
            found.update(str(item) for item in value)
        elif isinstance(value, str):
            found.update(part for part in value.strip("[]").replace(",", " ").split() if part)
    return found


def is_reviewer(claims: Mapping[str, Any] | None) -> bool:
    """Whether the caller belongs to the reviewer group (``PICOFLOW_REVIEWER_GROUP``); nobody does when it is
    unset, and an anonymous caller never does."""
    group = (os.environ.get(REVIEWER_GROUP_VARIABLE) or "").strip()
    return bool(group) and principal(claims) is not None and group in groups(claims)
