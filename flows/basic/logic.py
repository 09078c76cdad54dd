"""FooLogicStep and GooLogicStep: deterministic stages that route without calling a model."""

from __future__ import annotations

from flows.basic.favorites import FavoritesStep
from picoflow import LogicStep, Transition, go


class FooLogicStep(LogicStep):
    """First hop after the weather stage; hands GooLogicStep a value through ``with_state``."""

    async def run_logic(self) -> Transition:
        # with_state writes to the destination (GooLogicStep), not to this step.
        return go(GooLogicStep).with_state({"fooData": "fooValue"})


class GooLogicStep(LogicStep):
    """Second hop; the state it passes lands on FavoritesStep."""

    async def run_logic(self) -> Transition:
        return go(FavoritesStep).with_state({"gooData": "gooValue"})
