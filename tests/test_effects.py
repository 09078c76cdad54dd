"""Effect tools run once per turn: a retried turn replays the journaled outcome instead of calling the handler.

Every scenario is the original's SupportFlow situation: a refund tool ran, then the turn failed (the next model
call, a conflict, a deadline), and the client retried. The retry's model invents new tool-call ids, as a real
model does; the handler must not run again, the model must read the same tool result, and the session must end
as if the turn had run once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, stay, tool, tools
from picoflow.authoring.step import direct_result
from picoflow.authoring.step_runs import RunStepRequest
from picoflow.errors import PicoFlowError
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.journal import JOURNAL_TTL_SECONDS, canonical_json, effect_key
from picoflow.session.memory_store import MemorySessionStore
from picoflow.session.sqlite_store import SQLiteSessionStore
from picoflow.session.store import SessionStore

#: Each handler run appends (tool, arguments, key) here: the outside world the effects change.
APPLIED: list[tuple[str, dict[str, Any], str]] = []


class Refund(BaseModel):
    order: str
    amount: float


class SupportStep(Step):
    def get_prompt(self) -> str:
        return "Help with orders."

    @tool(effect=True)
    async def refund(self, args: Refund) -> Any:
        """Refund an order."""
        key = self.tool_idempotency_key()
        APPLIED.append(("refund", args.model_dump(), key))
        self.save_state({"refunds": [*(self.get_state("refunds") or []), args.order]})
        return stay(f"Refunded {args.amount:.2f} on {args.order} (ref {key[:8]}).")

    @tool
    async def lookup(self, args: Refund) -> Any:
        """Look an order up (changes nothing)."""
        APPLIED.append(("lookup", args.model_dump(), self.tool_idempotency_key()))
        return stay("found")


class SupportFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="support", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [SupportStep(self)]


def refund_call(call_id: str, order: str = "A1", amount: float = 10) -> dict[str, Any]:
    return {"tool_calls": [{"name": "refund", "args": {"order": order, "amount": amount}, "id": call_id}]}


OUTAGE = {"error": "upstream down", "status": 400}


def engine_with(store: SessionStore, script: list[Any]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(script)
    return FlowEngine([SupportFlow], store, [provider], retry_delay=0), provider


async def opened(store: SessionStore) -> str:
    """A session with one committed turn, so the refund turn starts from revision 1."""
    engine, _ = engine_with(store, [{"content": "Hello, how can I help?"}])
    response = await engine.run("SupportFlow", "hi")
    assert response.success
    return response.session


def refunds() -> list[tuple[str, dict[str, Any], str]]:
    return [entry for entry in APPLIED if entry[0] == "refund"]


@pytest.fixture(autouse=True)
def _fresh_world() -> None:
    APPLIED.clear()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> SessionStore:
    return MemorySessionStore() if request.param == "memory" else SQLiteSessionStore(tmp_path / "s.db")


async def test_a_retry_after_a_model_outage_replays_the_refund(store: SessionStore) -> None:
    session = await opened(store)
    # Attempt 1: the refund runs, then the model fails: 502, the session is unchanged.
    engine, _ = engine_with(store, [refund_call("call_first"), OUTAGE])
    failed = await engine.run("SupportFlow", "refund A1", session)
    assert failed.error_code == "MODEL_UNAVAILABLE"
    assert len(refunds()) == 1
    # Attempt 2 (no key, by session id): the model invents another call id; the handler does not run again.
    engine, provider = engine_with(store, [refund_call("call_second"), {"content": "Done: refunded."}])
    retried = await engine.run("SupportFlow", "refund A1", session)
    assert retried.success, retried.message
    assert retried.message == "Done: refunded."
    assert len(refunds()) == 1
    # The model read the same tool result as in the first attempt, under the new call's id.
    result = provider.calls[1][-1]
    assert result.type == "tool" and result.tool_call_id == "call_second"
    assert result.content.startswith("Refunded 10.00 on A1 (ref ")
    assert refunds()[0][2][:8] in result.content
    # The state the handler saved came back from the journal, and the turn committed once.
    doc = await store.load(session)
    assert doc is not None and doc.revision == 2
    assert doc.flow.steps[0].state["refunds"] == ["A1"]
    assert [entry.message for entry in doc.log if entry.message.startswith("effect")] == ["effect replayed"]


async def test_the_key_survives_new_call_ids_and_is_documented(store: SessionStore) -> None:
    session = await opened(store)
    engine, _ = engine_with(store, [refund_call("x1"), OUTAGE])
    await engine.run("SupportFlow", "refund", session)
    key = refunds()[0][2]
    # The documented derivation: session id, starting revision, step, tool, canonical arguments, ordinal.
    assert key == effect_key(session, 1, "SupportStep", "refund", {"order": "A1", "amount": 10.0}, 0)
    assert canonical_json({"order": "A1", "amount": 10.0}) == '{"amount":10.0,"order":"A1"}'
    # The model's spelling of the same arguments (an int where the schema says float) gives the same key.
    assert effect_key(session, 1, "SupportStep", "refund", {"amount": 10.0, "order": "A1"}, 0) == key


async def test_an_effect_with_other_arguments_runs(store: SessionStore) -> None:
    session = await opened(store)
    engine, _ = engine_with(store, [refund_call("c1", "A1"), OUTAGE])
    await engine.run("SupportFlow", "refund A1", session)
    engine, _ = engine_with(store, [refund_call("c2", "B2"), {"content": "Refunded B2."}])
    retried = await engine.run("SupportFlow", "refund B2 instead", session)
    assert retried.success
    assert [(entry[1]["order"]) for entry in refunds()] == ["A1", "B2"]
    assert refunds()[0][2] != refunds()[1][2]


async def test_a_later_turn_gets_new_keys_and_runs_again(store: SessionStore) -> None:
    session = await opened(store)
    for turn in range(2):
        engine, _ = engine_with(store, [refund_call(f"c{turn}"), {"content": "ok"}])
        assert (await engine.run("SupportFlow", "refund A1", session)).success
    # The same call in two committed turns is two refunds with two keys.
    assert len(refunds()) == 2
    assert refunds()[0][2] != refunds()[1][2]


async def test_identical_calls_in_one_turn_each_run_once_and_replay_in_order(store: SessionStore) -> None:
    session = await opened(store)
    twice = {"tool_calls": [refund_call("a")["tool_calls"][0], refund_call("b")["tool_calls"][0]]}
    engine, _ = engine_with(store, [twice, OUTAGE])
    await engine.run("SupportFlow", "refund A1 twice", session)
    assert len(refunds()) == 2
    assert refunds()[0][2] != refunds()[1][2]  # ordinals 0 and 1
    twice_again = {"tool_calls": [refund_call("c")["tool_calls"][0], refund_call("d")["tool_calls"][0]]}
    engine, provider = engine_with(store, [twice_again, {"content": "both done"}])
    assert (await engine.run("SupportFlow", "refund A1 twice", session)).success
    assert len(refunds()) == 2
    results = [message.content for message in provider.calls[1] if message.type == "tool"]
    assert results[0] != results[1] and all(text.startswith("Refunded") for text in results)


async def test_plain_tools_keep_todays_key_and_run_on_every_attempt(store: SessionStore) -> None:
    session = await opened(store)
    lookup = {"tool_calls": [{"name": "lookup", "args": {"order": "A1", "amount": 1}, "id": "l1"}]}
    engine, _ = engine_with(store, [lookup, OUTAGE])
    await engine.run("SupportFlow", "look", session)
    lookup_again = {"tool_calls": [{"name": "lookup", "args": {"order": "A1", "amount": 1}, "id": "l2"}]}
    engine, _ = engine_with(store, [lookup_again, {"content": "found"}])
    await engine.run("SupportFlow", "look", session)
    calls = [entry for entry in APPLIED if entry[0] == "lookup"]
    assert len(calls) == 2
    assert calls[0][2] != calls[1][2]  # the model's call id is part of a plain tool's key


async def test_a_keyed_first_turn_retried_replays() -> None:
    store = MemorySessionStore()
    key = "k" * 40
    engine, _ = engine_with(store, [refund_call("f1"), OUTAGE])
    failed = await engine.run("SupportFlow", "refund A1", idempotency_key=key)
    assert not failed.success
    engine, _ = engine_with(store, [refund_call("f2"), {"content": "refunded"}])
    retried = await engine.run("SupportFlow", "refund A1", idempotency_key=key)
    assert retried.success and retried.message == "refunded"
    assert len(refunds()) == 1


async def test_a_keyless_retry_of_a_failed_first_turn_by_its_session_id_replays() -> None:
    store = MemorySessionStore()
    engine, _ = engine_with(store, [refund_call("f1"), OUTAGE])
    failed = await engine.run("SupportFlow", "refund A1")
    assert not failed.success and failed.session
    engine, _ = engine_with(store, [refund_call("f2"), {"content": "refunded"}])
    retried = await engine.run("SupportFlow", "refund A1", failed.session)
    assert retried.success and retried.session == failed.session
    assert len(refunds()) == 1


async def test_a_second_attempt_running_beside_the_first_replays_and_one_of_them_gets_409() -> None:
    store = MemorySessionStore()
    session = await opened(store)
    # Attempt 1 runs the refund, then waits on a slow model; the client gives up and retries elsewhere (another
    # engine: another process's locks), while attempt 1 still runs.
    slow, _ = engine_with(store, [refund_call("c1"), {"content": "slow answer", "delay": 0.4}])
    fast, _ = engine_with(store, [refund_call("c2"), {"content": "refunded"}])

    async def retry_later() -> Any:
        await asyncio.sleep(0.2)
        return await fast.run("SupportFlow", "refund A1", session)

    first, second = await asyncio.gather(slow.run("SupportFlow", "refund A1", session), retry_later())
    assert second.success and second.message == "refunded"
    assert first.error_code == "SESSION_CONFLICT"
    assert len(refunds()) == 1


async def test_a_turn_that_lost_to_another_turn_is_retried_as_a_new_turn() -> None:
    store = MemorySessionStore()
    session = await opened(store)
    engine, _ = engine_with(store, [refund_call("c1"), {"content": "refunded", "delay": 0.2}])

    async def move_the_session_on() -> None:
        await asyncio.sleep(0.1)
        doc = await store.load(session)
        assert doc is not None
        await store.save(doc, doc.revision)

    first, _ = await asyncio.gather(engine.run("SupportFlow", "refund A1", session), move_the_session_on())
    assert first.error_code == "SESSION_CONFLICT"
    # Another turn moved the session on: re-sending is a new turn from the new revision, with new keys, so a
    # model that asks for the refund again is honoured.
    engine, _ = engine_with(store, [refund_call("c2"), {"content": "refunded"}])
    assert (await engine.run("SupportFlow", "refund A1", session)).success
    assert len(refunds()) == 2


async def test_a_turn_deadline_after_the_tool_replays_on_retry(store: SessionStore) -> None:
    session = await opened(store)
    engine, _ = engine_with(store, [refund_call("d1"), {"content": "late", "delay": 2}])
    late = await engine.run("SupportFlow", "refund A1", session, deadline=time.monotonic() + 0.5)
    assert late.status_code == 504, late.error_code
    engine, _ = engine_with(store, [refund_call("d2"), {"content": "refunded"}])
    assert (await engine.run("SupportFlow", "refund A1", session)).success
    assert len(refunds()) == 1


class GroupStep(Step):
    @tools(["refund", "notify"], effect=True)
    async def both(self, calls: list[dict[str, Any]]) -> Any:
        keys = [self.tool_idempotency_key(call) for call in calls]
        APPLIED.append(("group", {"calls": [call["args"] for call in calls]}, "|".join(keys)))
        return stay("both done").with_state({"keys": keys})


class SpecStep(Step):
    async def refund(self, args: dict[str, Any]) -> Any:
        APPLIED.append(("refund", args, self.tool_idempotency_key()))
        return None


def refund_spec(effect: bool) -> ToolSpec:
    return ToolSpec(name="refund", description="Refund an order.", schema=Refund, effect=effect)


class GroupFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="support", retry_attempts=1)

    def define_tools(self) -> list[ToolSpec]:
        return [refund_spec(False), ToolSpec(name="notify", description="Notify.", schema=Refund)]

    def define_steps(self) -> list[Step]:
        return [GroupStep(self)]


class SpecFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="support", retry_attempts=1)

    def define_tools(self) -> list[ToolSpec]:
        return [refund_spec(True)]

    def define_steps(self) -> list[Step]:
        return [SpecStep(self)]


class SpecStepOffering(SpecStep):
    def use_tools(self) -> list[str]:
        return ["refund"]


class OfferingSpecFlow(SpecFlow):
    def define_steps(self) -> list[Step]:
        return [SpecStepOffering(self)]


async def _fail_then_retry(flow: type[Flow], first: list[Any], second: list[Any]) -> tuple[Any, Any]:
    store = MemorySessionStore()
    # Enough replies for a coordinator whose workers also answer the opening turn.
    engine = FlowEngine([flow], store, [ScriptedProvider([{"content": "hi"}] * 3)], retry_delay=0)
    opened = await engine.run(flow.id, "hi")
    assert opened.success, opened.detail
    session = opened.session
    engine = FlowEngine([flow], store, [ScriptedProvider(first)], retry_delay=0)
    failed = await engine.run(flow.id, "go", session)
    engine = FlowEngine([flow], store, [ScriptedProvider(second)], retry_delay=0)
    return failed, await engine.run(flow.id, "go", session)


class GroupOffering(GroupStep):
    def use_tools(self) -> list[str]:
        return ["refund", "notify"]


class OfferingGroupFlow(GroupFlow):
    def define_steps(self) -> list[Step]:
        return [GroupOffering(self)]


async def test_a_tools_group_declared_as_an_effect_is_journaled_with_a_key_per_call() -> None:
    def batch(suffix: str) -> dict[str, Any]:
        return {"tool_calls": [
            {"name": "refund", "args": {"order": "A1", "amount": 5}, "id": f"r{suffix}"},
            {"name": "notify", "args": {"order": "A1", "amount": 5}, "id": f"n{suffix}"},
        ]}

    failed, retried = await _fail_then_retry(OfferingGroupFlow, [batch("1"), OUTAGE], [batch("2"), {"content": "ok"}])
    assert not failed.success and retried.success
    groups = [entry for entry in APPLIED if entry[0] == "group"]
    assert len(groups) == 1
    refund_key, notify_key = groups[0][2].split("|")
    assert refund_key != notify_key


async def test_a_toolspec_declared_as_an_effect_makes_its_handler_one() -> None:
    failed, retried = await _fail_then_retry(
        OfferingSpecFlow, [refund_call("s1"), OUTAGE], [refund_call("s2"), {"content": "ok"}]
    )
    assert not failed.success and retried.success
    assert len(refunds()) == 1


def test_the_decorators_mark_effects_and_the_derived_spec_says_so() -> None:
    from picoflow.authoring.step import typed_tool_specs

    (spec,) = [spec for spec in typed_tool_specs(SupportStep) if spec.name == "refund"]
    assert spec.effect is True
    assert [spec.effect for spec in typed_tool_specs(SupportStep) if spec.name == "lookup"] == [False]


async def test_a_store_without_a_journal_refuses_effect_tools() -> None:
    class Bare(SessionStore):
        def __init__(self) -> None:
            self.inner = MemorySessionStore()

        async def load(self, session_id: str) -> Any:
            return await self.inner.load(session_id)

        async def create(self, flow: Any, *, session_id: str | None = None, owner: str | None = None) -> Any:
            return await self.inner.create(flow, session_id=session_id, owner=owner)

        async def save(self, doc: Any, expected_revision: int) -> Any:
            return await self.inner.save(doc, expected_revision)

        async def delete(self, session_id: str, expected_revision: int | None = None) -> None:
            await self.inner.delete(session_id, expected_revision)

    with pytest.raises(PicoFlowError, match="keeps no effect journal"):
        await Bare().load_effect("s", "k")
    engine, _ = engine_with(Bare(), [refund_call("b1"), {"content": "never"}])
    response = await engine.run("SupportFlow", "refund")
    assert not response.success
    assert refunds() == []


async def test_journal_entries_expire_after_a_day(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    assert await store.record_effect("s", "k1", {"kind": "none"}) is True
    assert await store.record_effect("s", "k1", {"kind": "other"}) is False
    assert await store.load_effect("s", "k1") == {"kind": "none"}
    later = time.time() + JOURNAL_TTL_SECONDS + 5
    monkeypatch.setattr(time, "time", lambda: later)
    assert await store.load_effect("s", "k1") is None
    assert await store.record_effect("s", "k1", {"kind": "other"}) is True


class Stock(BaseModel):
    sku: str


class ReserveWorker(Step):
    @tool(effect=True)
    async def reserve(self, args: Stock) -> Any:
        """Reserve one item."""
        APPLIED.append(("reserve", args.model_dump(), self.tool_idempotency_key()))
        return direct_result({"reserved": args.sku})


class Coordinator(Step):
    async def run(self, user_message: str | None = None) -> Any:
        batch = await self.run_steps(
            [RunStepRequest(ReserveWorker, key=sku, user_message=f"reserve {sku}") for sku in ("A", "B")],
            max_concurrency=1,
        )
        self.save_state({"reserved": [branch.output for branch in batch.fulfilled]})
        return await super().run(user_message)


class ReserveFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="reserve", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [Coordinator(self), ReserveWorker(self)]


async def test_parallel_workers_effects_replay_their_direct_results() -> None:
    def reserve(sku: str, call_id: str) -> dict[str, Any]:
        return {"tool_calls": [{"name": "reserve", "args": {"sku": sku}, "id": call_id}]}

    failed, retried = await _fail_then_retry(
        ReserveFlow, [reserve("A", "a1"), reserve("B", "b1"), OUTAGE], [reserve("A", "a2"), reserve("B", "b2"),
                                                                        {"content": "both reserved"}]
    )
    assert failed.error_code == "MODEL_UNAVAILABLE"
    assert retried.success and retried.message == "both reserved"
    assert [entry[1]["sku"] for entry in APPLIED if entry[0] == "reserve"] == ["A", "B"]


async def test_a_replay_after_a_new_effect_keeps_what_the_new_effect_did(store: SessionStore) -> None:
    """A retried turn runs a refund the first attempt never reached, then replays the one it did run: both
    refunds stay recorded (the replay applies only what its own effect changed)."""
    session = await opened(store)
    engine, _ = engine_with(store, [refund_call("first_a", "A1"), OUTAGE])
    failed = await engine.run("SupportFlow", "refund A1 and B2", session)
    assert failed.error_code == "MODEL_UNAVAILABLE"
    # The retry's model calls B2 first (a new effect: it runs), then A1 (journaled: replayed).
    engine, _ = engine_with(store, [
        refund_call("retry_b", "B2"), refund_call("retry_a", "A1"), {"content": "Both refunded."}
    ])
    retried = await engine.run("SupportFlow", "refund A1 and B2", session)
    assert retried.success, retried.detail
    assert [entry[1]["order"] for entry in refunds()] == ["A1", "B2"]
    doc = await store.load(session)
    assert doc is not None
    assert sorted(doc.flow.steps[0].state["refunds"]) == ["A1", "B2"]


def test_changes_are_applied_by_path_and_leave_other_keys_alone() -> None:
    from picoflow.turn.effects import apply_changes, changes

    before = {"refunds": ["A1"], "profile": {"name": "Ada", "tier": "gold"}, "gone": 1}
    after = {"refunds": ["A1", "B2"], "profile": {"name": "Ada", "tier": "platinum"}, "new": {"x": [1]}}
    ops = changes(before, after)
    live = {"refunds": ["A1", "C3"], "profile": {"name": "Ada", "tier": "gold", "city": "Oslo"}, "gone": 1, "own": 2}
    apply_changes(live, ops)
    assert live == {"refunds": ["A1", "C3", "B2"], "profile": {"name": "Ada", "tier": "platinum", "city": "Oslo"},
                    "new": {"x": [1]}, "own": 2}
