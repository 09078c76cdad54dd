"""One-step flows that look at an attached file, one per provider, for the provider file-part tests."""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step


class LookStep(Step):
    def get_prompt(self) -> str:
        return "Describe the attached file in one sentence."


class _LookFlow(Flow):
    selection: ModelSelection

    def config_model(self) -> ModelSelection:
        return self.selection

    def define_steps(self) -> list[Step]:
        return [LookStep(self).use_memory("look")]


class AnthropicLookFlow(_LookFlow):
    selection = ModelSelection(provider="anthropic", name="claude-sonnet-4-5", params={"max_tokens": 256})


class BedrockLookFlow(_LookFlow):
    selection = ModelSelection(provider="bedrock", name="amazon.nova-lite-v1:0", params={"max_tokens": 256})


class GoogleLookFlow(_LookFlow):
    selection = ModelSelection(provider="google", name="gemini-2.5-flash", params={"max_tokens": 256})


class OllamaLookFlow(_LookFlow):
    selection = ModelSelection(provider="ollama", name="llava")
