"""Session stores and the session document they keep: the public home of the names a store user handles.

``SessionStore`` is the interface; ``MemorySessionStore``, ``SQLiteSessionStore`` and ``DynamoDBSessionStore``
implement it, and ``store_from_env`` picks one from ``SESSION_STORE``. ``SessionDoc`` and its parts are the
persisted document a flow's ``on_restore_session_doc`` receives. Each name loads its module on first use, so
memory and SQLite users never load boto3.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from picoflow.session.document import (
        DecisionUsage,
        FlowDoc,
        LogEntry,
        MessageDoc,
        ModelSelectionDoc,
        NamespaceDoc,
        SequenceItem,
        SessionDoc,
        StepDoc,
        TokenUsage,
        ToolCallDoc,
    )
    from picoflow.session.dynamodb_store import DynamoDBSessionStore
    from picoflow.session.factory import store_from_env
    from picoflow.session.memory_store import MemorySessionStore
    from picoflow.session.sqlite_store import SQLiteSessionStore
    from picoflow.session.store import SessionStore

# Where each name is defined.
_MODULES: dict[str, str] = {
    "DecisionUsage": "picoflow.session.document",
    "DynamoDBSessionStore": "picoflow.session.dynamodb_store",
    "FlowDoc": "picoflow.session.document",
    "LogEntry": "picoflow.session.document",
    "MemorySessionStore": "picoflow.session.memory_store",
    "MessageDoc": "picoflow.session.document",
    "ModelSelectionDoc": "picoflow.session.document",
    "NamespaceDoc": "picoflow.session.document",
    "SQLiteSessionStore": "picoflow.session.sqlite_store",
    "SequenceItem": "picoflow.session.document",
    "SessionDoc": "picoflow.session.document",
    "SessionStore": "picoflow.session.store",
    "StepDoc": "picoflow.session.document",
    "TokenUsage": "picoflow.session.document",
    "ToolCallDoc": "picoflow.session.document",
    "store_from_env": "picoflow.session.factory",
}

__all__ = [
    "DecisionUsage",
    "DynamoDBSessionStore",
    "FlowDoc",
    "LogEntry",
    "MemorySessionStore",
    "MessageDoc",
    "ModelSelectionDoc",
    "NamespaceDoc",
    "SQLiteSessionStore",
    "SequenceItem",
    "SessionDoc",
    "SessionStore",
    "StepDoc",
    "TokenUsage",
    "ToolCallDoc",
    "store_from_env",
]


def __getattr__(name: str) -> Any:
    """Import a name's module on first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("_"))})
