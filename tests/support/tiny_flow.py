"""A one-step flow for the race and fault tests, loaded by the handler through ``PICOFLOW_FLOWS``.

Every turn is exactly one model call in one step and one memory namespace, so a test can predict the
stored memory from the turns that won: each winning turn appends its human message and the AI reply.
"""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step

#: The memory namespace the step writes to.
NAMESPACE = "chat"


class TinyStep(Step):
    def get_prompt(self) -> str:
        return "Acknowledge the user's message."


class TinyFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [TinyStep(self).use_memory(NAMESPACE)]
