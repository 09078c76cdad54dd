"""BasicFlow: a small profile collection that exercises the main parts of the Step contract.

Path: WeatherStep -> FooLogicStep -> GooLogicStep -> FavoritesStep -> NameStep (runs InContextStep
inline, which runs ConcurStep1..4 as parallel workers) -> DOBStep -> AddressStep -> TerminateSessionStep.
With ``config.isPresident`` the session starts at PresidentStep instead and ends after one answer.

The flow is defined here, in the package module, so ``PICOFLOW_FLOWS=flows.basic`` registers it.
"""

from __future__ import annotations

from flows.basic.city_weather import SERVER as WEATHER_SERVER
from flows.basic.concurrent import ConcurStep1, ConcurStep2, ConcurStep3, ConcurStep4
from flows.basic.favorites import FavoritesStep
from flows.basic.in_context import InContextStep
from flows.basic.logic import FooLogicStep, GooLogicStep
from flows.basic.president import PresidentStep
from flows.basic.profile import AddressStep, DOBStep, NameStep
from flows.basic.weather import WeatherStep
from picoflow import Flow, ModelSelection, Step, TerminateSessionStep
from picoflow.mcp import MCPServerSpec
from picoflow.mcp.environment import server_from_env
from picoflow.stores import SessionDoc

# Matches the original's default session expiry of 600 seconds.
IDLE_EXPIRY_MS = 600_000

_LOW_REASONING = {"reasoning": {"effort": "low"}}


class BasicFlow(Flow):
    """Weather, favourites, name, date of birth and address, one step each."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini", params={"temperature": 0.2}, retry_attempts=3)

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        # WEATHER_MCP_URL (streamable HTTP), else WEATHER_MCP_COMMAND (stdio), else the bundled server over stdio.
        return [server_from_env(WEATHER_SERVER, "WEATHER_MCP", "flows.basic.weather_mcp_server", timeout=10.0)]

    def define_steps(self) -> list[Step]:
        # Reasoning models get their own params: the flow's temperature is not inherited by another model.
        return [
            WeatherStep(self).use_model(ModelSelection(provider="openai", name="gpt-5", params=_LOW_REASONING)),
            NameStep(self).use_memory("default"),
            AddressStep(self).use_memory("default"),
            DOBStep(self)
            .use_memory("default")
            .use_model(ModelSelection(provider="openai", name="gpt-5.1", params=_LOW_REASONING)),
            FooLogicStep(self).use_memory("default"),
            GooLogicStep(self).use_memory("default"),
            InContextStep(self).use_memory("separate"),
            # No use_memory(): each worker keeps its own class-named namespace, so no two branches of one
            # run_steps() call could ever share a history.
            ConcurStep1(self),
            ConcurStep2(self),
            ConcurStep3(self),
            ConcurStep4(self),
            PresidentStep(self).use_memory("president"),
            FavoritesStep(self).use_memory("favorite"),
            TerminateSessionStep(self).use_memory("temp"),
        ]

    def initial_step(self) -> type[Step]:
        return PresidentStep if self.get_context("config.isPresident") else WeatherStep

    async def on_restore_session_doc(self, doc: SessionDoc) -> SessionDoc | None:
        # A session left idle too long starts over rather than resuming half-collected data.
        if self.session_idle_ms(doc) > IDLE_EXPIRY_MS:
            return None
        return await super().on_restore_session_doc(doc)


__all__ = [
    "AddressStep",
    "BasicFlow",
    "ConcurStep1",
    "ConcurStep2",
    "ConcurStep3",
    "ConcurStep4",
    "DOBStep",
    "FavoritesStep",
    "FooLogicStep",
    "GooLogicStep",
    "InContextStep",
    "NameStep",
    "PresidentStep",
    "WeatherStep",
]
