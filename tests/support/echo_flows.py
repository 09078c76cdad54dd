"""Two one-step flows the handler tests register: a plain-text one and one answering as JSON."""

from __future__ import annotations

from picoflow import Flow, ModelSelection, Step


class EchoStep(Step):
    def get_prompt(self) -> str:
        return "Answer the user briefly."


class EchoFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [EchoStep(self)]


class JsonStep(Step):
    def __init__(self, flow: Flow) -> None:
        super().__init__(flow)
        self.content_type = "application/json"

    def get_prompt(self) -> str:
        return "Answer with a JSON object."


class JsonFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [JsonStep(self)]
