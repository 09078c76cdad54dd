"""The flow of the memory benchmark: the profile collection on OpenAI's gpt-4o, served by the replay server.

Its own module so the function process imports nothing of the benchmark itself (``PICOFLOW_FLOWS`` names it).
"""

from __future__ import annotations

from benchmarks.collection import ProfileCollectionFlow
from picoflow import ModelSelection


class OpenAICollectionFlow(ProfileCollectionFlow):
    """``ProfileCollectionFlow`` on ``gpt-4o`` through the ``openai`` provider, as a deployment runs it."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")
