"""Opt-in mid-turn checkpoints and batch coordinator mode."""

from __future__ import annotations

import json
import threading

from picoflow import Flow, ModelSelection, Step, ToolSpec, go, tool
from picoflow.batch import http_invoker
from picoflow.local.serve import make_server
from picoflow.results import RunResponse
from picoflow.stores import MemorySessionStore
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
    insert = store.insert

    async def counted_insert(doc):
        # A new session's first write is its insert.
        writes.append(0)
        return await insert(doc)

    store.insert = counted_insert
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
    allowed_private_config = frozenset({"_concurrent"})

    def is_batch_coordinator(self) -> bool:
        # The flow decides in code; it lets a request ask through the one private key it accepts.
        return bool(self.get_context("config._concurrent"))

    async def spawn_steps(self) -> str:
        def remember(item: int, response: RunResponse) -> None:
            CoordinatorFlow.collected.append((item, response.message, response.session))

        await self.concurrent_steps(
            items=[1, 2, 3], batch_size=2, on_config=lambda item: {"item": item}, on_bot_response=remember
        )
        self.mark_completed()
        return f"ran {len(CoordinatorFlow.collected)} items"


async def test_batch_coordinator_runs_one_new_session_per_item():
    CoordinatorFlow.collected = []
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


def _fake_api(events: list) -> object:
    """A stand-in Lambda handler: records each event and answers by the item number in its config."""

    def handler(event: dict, context: object) -> dict:
        body = json.loads(event["body"])
        events.append(body)
        item = body["config"]["item"]
        if item == 2:
            return {"statusCode": 409, "headers": {"Content-Type": "application/json"},
                    "body": json.dumps({"success": False, "completed": False, "message": "busy", "session": "s2",
                                        "code": "SESSION_CONFLICT"})}
        if item == 3:
            return {"statusCode": 200, "headers": {"Content-Type": "text/markdown", "CHAT_SESSION_ID": "s3"},
                    "body": "| a |"}
        return {"statusCode": 200, "headers": {"Content-Type": "application/json", "CHAT_SESSION_ID": f"s{item}"},
                "body": json.dumps({"success": True, "completed": False, "message": f"hi {item}",
                                    "session": f"s{item}", "contentType": "text/plain"})}

    return handler


async def test_batch_items_can_start_over_the_http_api(monkeypatch):
    events: list = []
    server = make_server("127.0.0.1", 0, _fake_api(events))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SELF_URL", server.url + "/ai/run")
        CoordinatorFlow.collected = []
        engine, model = scripted_engine([CoordinatorFlow], [])
        response = await engine.run("CoordinatorFlow", None, config={"_concurrent": True})
    finally:
        server.shutdown()
    assert response.success and model.calls == []  # every item ran behind the HTTP API, none in process
    assert sorted(body["config"]["item"] for body in events) == [1, 2, 3]
    assert all(body["flowName"] == "CoordinatorFlow" and "message" not in body for body in events)
    assert sorted(CoordinatorFlow.collected) == [(1, "hi 1", "s1"), (3, "| a |", "s3")]
    doc = await engine.session_store.load(response.session)
    assert [(e.message, e.model_extra["code"]) for e in doc.error] == [("Batch item failed", "SESSION_CONFLICT")]


async def test_an_unreachable_batch_endpoint_is_a_failed_item():
    invoke = http_invoker("http://127.0.0.1:9/ai/run", timeout=2)
    response = await invoke("AnyFlow", "hi", {"item": 1})
    assert (response.success, response.error_code, response.status_code) == (False, "BATCH_ENDPOINT_UNREACHABLE", 503)
