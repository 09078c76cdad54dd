"""Build engines on a scripted model for tests."""

from __future__ import annotations

from typing import Any

from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.store import SessionStore
from picoflow.stores import MemorySessionStore


def scripted_engine(
    flows: list[type], replies: list[Any], store: SessionStore | None = None
) -> tuple[FlowEngine, ScriptedProvider]:
    """An engine whose every model call, whatever the provider, is served from ``replies``."""
    provider = ScriptedProvider(replies)
    registry = ProviderRegistry(override=provider)
    engine = FlowEngine(flows=flows, session_store=store or MemorySessionStore(), providers=registry, retry_delay=0)
    return engine, provider


def text(content: str, input_tokens: int = 10, output_tokens: int = 5) -> dict[str, Any]:
    return {"content": content, "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def call(*calls: tuple[str, dict[str, Any]], input_tokens: int = 10, output_tokens: int = 5) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [{"name": name, "args": args} for name, args in calls],
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
