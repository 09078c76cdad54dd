"""A flow whose every hook can be told to raise, for the failure-policy and leak tests.

``FaultyFlow.failing`` names the hooks that raise on the next requests (``ctor``, ``init``, ``steps``,
``model``, ``restore``, ``start``, ``tool``; ``hang`` makes the tool never return). Each raises an exception
whose text holds ``MARKER``, so a test can prove that no such text reaches a client.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, stay, tool

#: Text in every exception raised here: it must never reach a response.
MARKER = "MARKER-5f2c"


class NoArgs(BaseModel):
    pass


def _fail(hook: str) -> None:
    if hook in FaultyFlow.failing:
        raise RuntimeError(f"{MARKER} {hook} failed: password=hunter2 at /srv/app/{hook}.py")


class FaultyStep(Step):
    def get_prompt(self) -> str:
        return "Answer briefly; call explode when asked to."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="explode", description="Explode", schema=NoArgs)]

    async def on_start(self) -> Any:
        _fail("start")
        return None

    @tool
    async def explode(self, args: dict) -> object:
        if "hang" in FaultyFlow.failing:
            await asyncio.sleep(3600)
        _fail("tool")
        return stay("Nothing happened.")


class FaultyFlow(Flow):
    failing: ClassVar[set[str]] = set()

    def __init__(self) -> None:
        _fail("ctor")
        super().__init__()

    async def init(self) -> None:
        _fail("init")

    def config_model(self) -> ModelSelection:
        _fail("model")
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        _fail("steps")
        return [FaultyStep(self).use_memory("chat")]

    async def on_restore_session_doc(self, doc: Any) -> Any:
        _fail("restore")
        return doc


class KeepingFlow(FaultyFlow):
    """The same flow, opted into keeping the session when its code raises."""

    keep_session_on_error = True


class MigratingFlow(FaultyFlow):
    """The same flow with a restore hook that upgrades a stored document once, as a schema migration would."""

    async def on_restore_session_doc(self, doc: Any) -> Any:
        doc = await super().on_restore_session_doc(doc)
        if doc.flow.context.get("schema") != 2:
            doc.flow.context = {**doc.flow.context, "schema": 2}
        return doc
