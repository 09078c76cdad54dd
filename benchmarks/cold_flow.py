"""The flow of the cold-start benchmark: one conversational step with one tool, on OpenAI's gpt-4o-mini."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from picoflow import Flow, ModelSelection, Step, ToolSpec, Transition, stay, tool

GREETING = "Hello! Which city should I check the weather for?"


class CityArgs(BaseModel):
    city: str = Field(min_length=1, description="The city to check")


class WeatherStep(Step):
    def get_prompt(self) -> str:
        return "You are a weather assistant. Ask for a city, then call check_weather with it."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="check_weather", description="Check the weather of a city", schema=CityArgs)]

    @tool
    async def check_weather(self, args: dict[str, Any]) -> Transition:
        self.save_state({"city": args["city"]})
        return stay(f"It is sunny in {args['city']}.")


class ColdStartFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini", params={"temperature": 0.2})

    def define_steps(self) -> list[Step]:
        return [WeatherStep(self).use_memory("weather")]
