"""The conversation's state and memory.

Step and flow state paths (``state``), memory namespaces and their rolling summaries (``memory``), and the user's
requests a decision reads (``requests``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# ``picoflow.conversation`` was one module before it became this package: its names still resolve here, with a
# DeprecationWarning naming their new home, until the next release.
_OLD_NAMES = {"DEFAULT_MAX_PRIOR_REQUESTS", "DecisionConversation", "read_conversation"}


def __getattr__(name: str) -> Any:
    if name not in _OLD_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"'picoflow.conversation.{name}' is deprecated and will be removed in the next release; "
        f"use 'picoflow.conversation.requests.{name}'.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("picoflow.conversation.requests"), name)
