"""PresidentStep: the alternative entry point, a one-shot question built from the request config."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage

from picoflow import Step
from picoflow.authoring.prompts import load_prompt
from picoflow.messages import HumanMessageEx

PROMPT = load_prompt("president.md", __file__).strip()


class PresidentStep(Step):
    """Answers "who was the nth president" from ``config.nth`` and completes the session in one turn."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        nth = self.get_context("config.nth") or "1st"
        # A worker, not a conversation: the session ends with this one answer.
        self.session_completed()
        return HumanMessageEx(self, f"Who was the {nth} President of the United States?")

    def get_prompt(self) -> str:
        return PROMPT

    async def on_response(self, result: Any) -> str:
        self.save_state({"who": result})
        return result if isinstance(result, str) else str(result)
