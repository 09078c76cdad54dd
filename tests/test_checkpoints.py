"""Opt-in mid-turn checkpoints and batch coordinator mode."""

from __future__ import annotations

from picoflow import Flow, MemorySessionStore, ModelSelection, Step, ToolSpec, go, tool
from picoflow.engine import RunResponse
from tests.support.engine import call, scripted_engine, text
from tests.test_tools import Args


class FirstStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="next", description="move on", schema=Args)]

    @tool
    async def next(self, args: dict) -> object:
        return go(SecondStep)


class SecondStep(Step):
    pass


class QuietFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [FirstStep(self), SecondStep(self)]


class CheckpointingFlow(QuietFlow):
    checkpoint_on_crossing = True


class BatchFlow(QuietFlow):
    def is_batch(self) -> bool:
        return True


def counting_store() -> tuple[MemorySessionStore, list[int]]:
    store = MemorySessionStore()
    writes: list[int] = []
    save = store.save

    async def counted(doc, expected):
        writes.append(expected)
        return await save(doc, expected)

    store.save = counted
    return store, writes


async def test_crossings_are_not_saved_unless_the_flow_opts_in():
    for flow, expected_writes in ((QuietFlow, 1), (CheckpointingFlow, 2), (BatchFlow, 2)):
        store, writes = counting_store()
        engine, _ = scripted_engine([flow], [call(("next", {})), text("second")], store=store)
        response = await engine.run(flow.id, "go")
        assert response.success and response.message == "second"
        assert len(writes) == expected_writes, flow.id
        assert (await store.load(response.session)).revision == expected_writes


class CoordinatorFlow(QuietFlow):
    collected: list = []

    async def spawn_steps(self) -> str:
        def remember(item: int, response: RunResponse) -> None:
            CoordinatorFlow.collected.append((item, response.message, response.session))

        await self.concurrent_steps(
            items=[1, 2, 3], batch_size=2, on_config=lambda item: {"item": item}, on_bot_response=remember
        )
        self.mark_completed()
        return f"ran {len(CoordinatorFlow.collected)} items"


async def test_batch_coordinator_runs_one_new_session_per_item():
    engine, _ = scripted_engine([CoordinatorFlow], [text("a"), text("b"), {"error": "boom"}] + [{"error": "boom"}] * 2)
    response = await engine.run("CoordinatorFlow", None, config={"_concurrent": True})
    assert response.success and response.completed
    assert response.message == "ran 2 items"
    items = sorted(item for item, _, _ in CoordinatorFlow.collected)
    assert items == [1, 2]
    sessions = {session for _, _, session in CoordinatorFlow.collected}
    assert len(sessions) == 2 and response.session not in sessions
    doc = await engine.session_store.load(response.session)
    assert [e.message for e in doc.log] == ["Batch progress", "Batch progress"]
    assert [e.message for e in doc.error] == ["Batch item failed"]
    for session in sessions:
        child = await engine.session_store.load(session)
        assert child.flow.context["config"]["item"] in (1, 2)
