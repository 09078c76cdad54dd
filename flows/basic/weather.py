"""WeatherStep: the default entry point, collecting temperatures for LA and NYC."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from flows.basic.city_weather import SUPPORTED_CITIES, fetch_temperatures, normalize_city
from flows.basic.common import ROLE, ExitOnRequest
from flows.basic.logic import FooLogicStep
from picoflow import Step, Transition, go, stay, tool, tools
from picoflow.authoring.prompts import prompt
from picoflow.mcp import MCPUnavailableError


class WeatherArgs(BaseModel):
    city: str = Field(description="One supported city alias: LA or NYC")


class WeatherStep(ExitOnRequest, Step):
    """Asks for LA and NYC, looks both up, and moves on once both temperatures are known."""

    def get_prompt(self) -> str:
        return prompt("weather.md", __file__, role=ROLE)

    # Used when get_weather arrives next to another tool; the group handler below takes every reply
    # that calls get_weather alone, however many times.
    @tool
    async def get_weather(self, args: WeatherArgs) -> Transition:
        """Look up the temperature of one supported city. Call it once per city the user names."""
        return await self._look_up([args.city])

    @tools(["get_weather"])
    async def get_weather_batch(self, calls: list[dict[str, Any]]) -> Transition:
        # Every call's arguments were validated against WeatherArgs before this runs (they arrive as dicts);
        # a blank city passes the schema, so it is refused here.
        cities = [call["args"]["city"] for call in calls]
        if not all(city.strip() for city in cities):
            return stay("Every get_weather call needs a city. Ask the user for LA or NYC.")
        return await self._look_up(cities)

    async def _look_up(self, typed: list[str]) -> Transition:
        cities = [normalize_city(name) for name in typed]
        unsupported = [name for name, city in zip(typed, cities, strict=True) if city not in SUPPORTED_CITIES]
        if unsupported:
            return stay(
                f"{' and '.join(unsupported)} {'is' if len(unsupported) == 1 else 'are'} not supported: "
                "only LA and NYC are. Ask the user to choose LA or NYC."
            )
        if len(set(cities)) != len(cities):
            return stay("Each city may be looked up only once per reply. Ask the user for the missing city.")
        # One backend request for the whole batch, however many tool calls the model made.
        try:
            readings = await fetch_temperatures(self.flow, cities)
        except MCPUnavailableError:
            return stay("The weather service is unavailable right now. Ask the user to try again in a moment.")
        for reading in readings:
            if reading.temperature is None:
                return stay(f"No temperature is available for {reading.city}. Ask the user for LA or NYC.")
            self.save_state({f"city_{reading.city}": reading.temperature})
        # Compare with None: 0 degrees is a real reading.
        missing = [city for city in SUPPORTED_CITIES if self.get_state(f"city_{city}") is None]
        if missing:
            return stay(f"{' and '.join(cities)} accepted. Ask the user for {' and '.join(missing)}.")
        return go(FooLogicStep)
