"""run_steps(): isolated workers, request-order publication, channels, conflicts, failure policies and cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, tool
from picoflow.authoring.step_runs import CancellationSignal, RunStepRequest, StepChannels
from picoflow.authoring.transitions import direct_result
from picoflow.errors import (
    ParallelCancelledError,
    ParallelDuplicateKeyError,
    ParallelExecutionError,
    ParallelMutationError,
    ParallelStateConflictError,
    PicoFlowError,
    SessionStoreError,
    public_message,
)
from picoflow.messages import HumanMessageEx
from picoflow.stores import MemorySessionStore
from tests.support.engine import call, scripted_engine, text

Scenario = Callable[[Step], Awaitable[Any]]

# Keys of AmountWorker branches in the order they finished (reset by each test that reads it).
COMPLETIONS: list[str] = []
RUNNING = {"now": 0, "max": 0}


class Amount(BaseModel):
    amount: int
    delay: float = 0.0


class AmountWorker(Step):
    """A worker that only contributes to reduced channels, so repeated copies never conflict."""

    def parallel_params_schema(self) -> type[BaseModel]:
        return Amount

    def parallel_state_channels(self) -> dict:
        return {
            "total": StepChannels.sum(),
            "by_key": StepChannels.keyed_by_branch(),
            "log": StepChannels.append(),
            "parity": StepChannels.append_unique_by("parity"),
            "record": StepChannels.merge_record(),
        }

    async def run(self, user_message: str | None = None) -> Any:
        invocation = self.get_parallel_invocation()
        await asyncio.sleep(invocation.params["delay"])
        amount = invocation.params["amount"]
        self.contribute_state("total", amount)
        self.contribute_state("by_key", amount)
        self.contribute_state("log", invocation.key)
        self.contribute_state("parity", {"parity": amount % 2, "key": invocation.key})
        self.contribute_state("record", {invocation.key: amount})
        COMPLETIONS.append(invocation.key)
        return amount


class ProfileWorker(Step):
    async def run(self, user_message: str | None = None) -> Any:
        name = self.get_parallel_invocation().params.get("name", "anon")
        self.save_state({"profile": {"name": name}})
        return name


class FailingWorker(Step):
    async def run(self, user_message: str | None = None) -> Any:
        raise ValueError("boom")


class ReplaceWorker(Step):
    def parallel_state_channels(self) -> dict:
        return {"owner": StepChannels.single_writer(), "score": StepChannels.sum()}

    async def run(self, user_message: str | None = None) -> Any:
        params = self.get_parallel_invocation().params
        for name, value in params.get("save", {}).items():
            self.save_state({name: value})
        for name, value in params.get("contribute", {}).items():
            self.contribute_state(name, value)
        for name in params.get("remove", []):
            self.remove_state(name)
        return None


class MutatingWorker(Step):
    async def run(self, user_message: str | None = None) -> Any:
        action = self.get_parallel_invocation().params["action"]
        flow = self.flow
        if action == "other_state":
            flow.save_step_state(ProfileWorker, {"profile": "hijacked"})
        elif action == "other_instance":
            flow.get_step(ProfileWorker.id).save_state({"profile": "hijacked"})
        elif action == "goto":
            await flow.goto(ProfileWorker)
        elif action == "complete":
            self.session_completed()
        elif action == "context":
            flow.add_context({"hijacked": True})
        elif action == "doc":
            flow.get_session_doc().run_status = "completed"
        elif action == "doc_list":
            flow.get_session_doc().log.append({"message": "hijacked"})
        elif action == "memory":
            flow.get_memory().enable_summary("anything")
        elif action == "params":
            self.get_parallel_invocation().params["action"] = "changed"
        elif action == "swallowed":
            with contextlib.suppress(ParallelMutationError):
                flow.save_step_state(ProfileWorker, {"profile": "hijacked"})
        return "done"


class ModelWorker(Step):
    def get_prompt(self) -> str:
        return f"Describe {self.get_parallel_invocation().params['topic']}."

    def parallel_state_channels(self) -> dict:
        return {"answers": StepChannels.keyed_by_branch()}

    async def on_response(self, result: Any) -> Any:
        self.contribute_state("answers", result)
        return result


class SkuArgs(BaseModel):
    pass


class InventoryWorker(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="report", description="Report the stock", schema=SkuArgs)]

    @tool
    async def report(self, args: dict) -> Any:
        sku = self.get_parallel_invocation().params["sku"]
        return direct_result({"sku": sku, "available": sku.startswith("SHIRT")})


class Inspector(Step):
    """Reports what it sees of NestedWorker's state; used at both nesting levels."""

    def parallel_state_channels(self) -> dict:
        return {"observed": StepChannels.keyed_by_branch(), "total": StepChannels.sum()}

    async def run(self, user_message: str | None = None) -> Any:
        self.contribute_state("observed", self.flow.get_step_state(NestedWorker, "before"))
        self.contribute_state("total", self.get_parallel_invocation().params.get("n", 0))
        return self.get_parallel_invocation().key


class NestedWorker(Step):
    async def run(self, user_message: str | None = None) -> Any:
        self.save_state({"before": "pre-fork"})
        inner = await self.run_steps(
            [RunStepRequest(Inspector, key="d", params={"n": 1}), RunStepRequest(Inspector, key="e", params={"n": 2})]
        )
        self.save_state({"inner_view": self.flow.get_step_state(Inspector)})
        if self.get_parallel_invocation().params.get("fail_after_join"):
            raise RuntimeError("failed after the inner join")
        return [branch.output for branch in inner.branches]


class ChildCaller(Step):
    async def run(self, user_message: str | None = None) -> Any:
        child = self.get_parallel_invocation().params["child"]
        output = await self.run_step(child)
        self.save_state({"child_output": output, "child_state": self.flow.get_step_state(ProfileWorker)})
        return output


class Sleeper(Step):
    async def run(self, user_message: str | None = None) -> Any:
        params = self.get_parallel_invocation().params
        signal = self.get_parallel_invocation().signal
        RUNNING["now"] += 1
        RUNNING["max"] = max(RUNNING["max"], RUNNING["now"])
        try:
            if params.get("cooperative"):
                await asyncio.wait_for(signal.wait(), 5)
                signal.raise_if_cancelled()
            await asyncio.sleep(params.get("seconds", 0.02))
        finally:
            RUNNING["now"] -= 1
        return self.get_parallel_invocation().key


class Coordinator(Step):
    async def run(self, user_message: str | None = None) -> Any:
        return await self.flow.scenario(self) or "ok"


WORKERS = [
    AmountWorker, ProfileWorker, FailingWorker, ReplaceWorker, MutatingWorker, ModelWorker, InventoryWorker,
    Inspector, NestedWorker, ChildCaller, Sleeper,
]


class ParallelFlow(Flow):
    scenario: Scenario
    settings: dict = {}

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def config_parallel_execution(self) -> dict:
        return self.settings

    def define_steps(self) -> list[Step]:
        return [Coordinator(self).use_memory("shared"), *(cls(self) for cls in WORKERS)]


def flow_with(scenario: Scenario, **settings: Any) -> type[Flow]:
    return type("ParallelFlow", (ParallelFlow,), {"scenario": staticmethod(scenario), "settings": settings})


async def run_scenario(scenario: Scenario, replies: list | None = None, store=None, **settings: Any):
    engine, model = scripted_engine([flow_with(scenario, **settings)], replies or [], store=store)
    response = await engine.run("ParallelFlow", "go")
    assert response.success, response.message
    doc = await engine.session_store.load(response.session)
    return doc, model


def public(state: dict) -> dict:
    return {key: value for key, value in state.items() if key != "_saveOn"}


def amounts(*pairs: tuple[str, int], delays: list[float] | None = None) -> list[RunStepRequest]:
    return [
        RunStepRequest(AmountWorker, key=key, params={"amount": amount, "delay": (delays or [0] * len(pairs))[i]})
        for i, (key, amount) in enumerate(pairs)
    ]


async def test_branches_come_back_in_request_order_and_state_is_published_before_return():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        batch = await step.run_steps(
            [
                RunStepRequest(ProfileWorker, params={"name": "Ada"}),
                *amounts(("slow", 2), ("fast", 3), delays=[0.03, 0.0]),
            ]
        )
        seen["batch"] = batch
        seen["profile"] = step.flow.get_step_state(ProfileWorker, "profile")
        seen["total"] = step.flow.get_step_state(AmountWorker, "total")

    COMPLETIONS.clear()
    doc, _ = await run_scenario(scenario)
    batch = seen["batch"]
    assert COMPLETIONS == ["fast", "slow"]
    assert [(b.index, b.key, b.step, b.status, b.output) for b in batch.branches] == [
        (0, "ProfileWorker", "ProfileWorker", "fulfilled", "Ada"),
        (1, "slow", "AmountWorker", "fulfilled", 2),
        (2, "fast", "AmountWorker", "fulfilled", 3),
    ]
    assert batch.fulfilled == batch.branches and batch.rejected == ()
    assert batch.published and not batch.cancelled
    assert seen["profile"] == {"name": "Ada"} and seen["total"] == 5
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["ProfileWorker"]["profile"] == {"name": "Ada"}
    assert public(states["AmountWorker"])["log"] == ["slow", "fast"]
    # Workers are recorded one level below their caller, in request order; the cursor never moved.
    assert [(s.level, s.step_name) for s in doc.flow.sequence] == [
        (1, "Coordinator"), (2, "ProfileWorker"), (2, "AmountWorker"), (2, "AmountWorker")
    ]
    assert doc.flow.current_step == "Coordinator"


async def test_ten_workers_publish_identical_state_across_twenty_runs_whatever_finishes_first():
    states, orders = [], set()
    for run in range(20):
        rng = random.Random(run)
        delays = [rng.uniform(0, 0.02) for _ in range(10)]

        async def scenario(step: Step, delays: list[float] = delays) -> None:
            await step.run_steps(amounts(*((f"k{i}", i + 1) for i in range(10)), delays=delays))

        COMPLETIONS.clear()
        doc, _ = await run_scenario(scenario)
        orders.add(tuple(COMPLETIONS))
        states.append(public(next(s.state for s in doc.flow.steps if s.name == "AmountWorker")))

    assert len(orders) > 1, "the delays should have varied the completion order"
    assert all(state == states[0] for state in states)
    keys = [f"k{i}" for i in range(10)]
    assert states[0] == {
        "total": 55,
        "by_key": {key: i + 1 for i, key in enumerate(keys)},
        "log": keys,
        "parity": [{"parity": 1, "key": "k0"}, {"parity": 0, "key": "k1"}],
        "record": {key: i + 1 for i, key in enumerate(keys)},
    }


async def test_an_atomic_batch_publishes_nothing_when_one_worker_fails():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        requests = [
            RunStepRequest(ProfileWorker, params={"name": "Ada"}),
            RunStepRequest(FailingWorker),
            *amounts(("a", 4)),
        ]
        atomic = await step.run_steps(requests, failure_policy="atomic")
        seen["atomic"] = atomic
        seen["after_atomic"] = [dict(step.flow.get_step_state(cls)) for cls in (ProfileWorker, AmountWorker)]
        seen["retained"] = await step.run_steps(requests)

    doc, _ = await run_scenario(scenario)
    atomic = seen["atomic"]
    assert not atomic.published
    assert [b.status for b in atomic.branches] == ["fulfilled", "rejected", "fulfilled"]
    assert [b.key for b in atomic.rejected] == ["FailingWorker"]
    assert isinstance(atomic.rejected[0].error, ValueError)
    assert seen["after_atomic"] == [{}, {}]
    # The default policy keeps the successful siblings.
    assert seen["retained"].published
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["ProfileWorker"]["profile"] == {"name": "Ada"}
    assert states["AmountWorker"]["total"] == 4
    assert public(states["FailingWorker"]) == {}


async def test_repeated_classes_need_unique_keys_and_nothing_runs_when_a_request_is_invalid():
    errors: list[Exception] = []

    async def scenario(step: Step) -> None:
        for requests in (
            [RunStepRequest(AmountWorker, params={"amount": 1}), RunStepRequest(AmountWorker, params={"amount": 2})],
            [*amounts(("same", 1)), RunStepRequest(ProfileWorker, key="same")],
            [*amounts(("ok", 1)), RunStepRequest(AmountWorker, key="bad", params={"amount": "many"})],
            [*amounts(("ok", 1)), RunStepRequest("NotAStep")],
            [*amounts(("ok", 1)), RunStepRequest(ProfileWorker, key=" ")],
        ):
            with pytest.raises(PicoFlowError) as caught:
                await step.run_steps(requests)
            errors.append(caught.value)
        for options in ({"failure_policy": "some"}, {"checkpoint": "always"}, {"max_concurrency": 0}):
            with pytest.raises(ParallelExecutionError):
                await step.run_steps(amounts(("ok", 1)), **options)

    COMPLETIONS.clear()
    doc, _ = await run_scenario(scenario)
    assert COMPLETIONS == []
    assert type(errors[0]) is ParallelExecutionError and "unique key" in errors[0].message
    assert isinstance(errors[1], ParallelDuplicateKeyError)
    assert "Invalid params for branch 'bad' of step 'AmountWorker': amount:" in errors[2].message
    assert errors[3].message == "Step 'NotAStep' is not defined in flow 'ParallelFlow'."
    assert "non-empty" in errors[4].message
    assert public(next(s.state for s in doc.flow.steps if s.name == "AmountWorker")) == {}


@pytest.mark.parametrize(
    "action",
    ["other_state", "other_instance", "goto", "complete", "context", "doc", "doc_list", "memory", "params",
     "swallowed"],
)
async def test_writes_outside_the_worker_raise_parallel_mutation_error_and_publish_nothing(action):
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        try:
            await step.run_steps([
                RunStepRequest(ProfileWorker, params={"name": "Ada"}),
                RunStepRequest(MutatingWorker, params={"action": action}),
            ])
        except ParallelMutationError as exc:
            seen["error"] = exc
        seen["profile"] = step.flow.get_step_state(ProfileWorker)

    doc, _ = await run_scenario(scenario)
    assert isinstance(seen["error"], ParallelMutationError)
    assert seen["profile"] == {}
    assert doc.run_status == "running"
    assert doc.flow.context == {}
    assert doc.flow.current_step == "Coordinator"
    assert not doc.flow.memory.get("anything")


async def test_goto_in_a_worker_gives_the_documented_message():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        with pytest.raises(ParallelMutationError) as caught:
            await step.run_steps([RunStepRequest(MutatingWorker, params={"action": "goto"})])
        seen["message"] = caught.value.message

    await run_scenario(scenario)
    assert seen["message"] == (
        "Cannot goto 'ProfileWorker' from a child execution frame. "
        "Return a result to the owning step instead."
    )


async def test_workers_read_snapshots_and_keep_private_state_and_memory():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        step.flow.get_memory("shared").append(HumanMessageEx(step, "earlier in the conversation"))
        batch = await step.run_steps(
            [
                RunStepRequest(ModelWorker, key="plot", params={"topic": "the plot"}, user_message="go plot"),
                RunStepRequest(ModelWorker, key="cast", params={"topic": "the cast"}, user_message="go cast"),
            ]
        )
        seen["batch"] = batch
        seen["shared"] = [m.content for m in step.flow.get_memory("shared")[1:]]
        seen["answers"] = step.flow.get_step_state(ModelWorker, "answers")

    # Both workers share the "shared" namespace with the coordinator, yet neither sees the other.
    def define_steps(self: Flow) -> list[Step]:
        steps = ParallelFlow.define_steps(self)
        return [s.use_memory("shared") if isinstance(s, ModelWorker) else s for s in steps]

    engine, model = scripted_engine(
        [type("ParallelFlow", (ParallelFlow,), {"scenario": staticmethod(scenario), "define_steps": define_steps})],
        [text("plot answer"), text("cast answer")],
    )
    response = await engine.run("ParallelFlow", "go")
    assert response.success, response.message
    requests = sorted(([m.content for m in c] for c in model.calls), key=lambda c: c[0])
    assert requests == [
        ["Describe the cast.", "Start", "earlier in the conversation", "go cast"],
        ["Describe the plot.", "Start", "earlier in the conversation", "go plot"],
    ]
    # Raw worker histories are discarded; outputs and published state carry the results.
    assert seen["shared"] == ["Start", "earlier in the conversation"]
    outputs = {b.key: b.output for b in seen["batch"].branches}
    assert seen["answers"] == outputs and set(outputs.values()) == {"plot answer", "cast answer"}
    doc = await engine.session_store.load(response.session)
    assert doc.tokens.input_tokens == 20 and doc.tokens.output_tokens == 10


async def test_two_branches_replacing_one_field_conflict_and_channels_combine_instead():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        def replace(key: str, **params: Any) -> RunStepRequest:
            return RunStepRequest(ReplaceWorker, key=key, params=params)

        for label, requests in {
            "replace": [replace("a", save={"value": 1}), replace("b", save={"value": 2})],
            "replace_and_reduce": [replace("a", save={"score": 1}), replace("b", contribute={"score": 2})],
            "single_writer": [replace("a", contribute={"owner": "a"}), replace("b", contribute={"owner": "b"})],
            "undeclared": [replace("a", contribute={"value": 1})],
            "not_json": [replace("a", contribute={"score": float("nan")})],
        }.items():
            try:
                await step.run_steps(requests)
            except ParallelExecutionError as exc:
                seen[label] = exc
        seen["untouched"] = dict(step.flow.get_step_state(ReplaceWorker))
        await step.run_steps([replace("a", contribute={"score": 1}), replace("b", contribute={"score": 2})])
        await step.run_steps([replace("a", save={"value": 1}), replace("b", contribute={"owner": "b"})])

    doc, _ = await run_scenario(scenario)
    assert type(seen["replace"]) is ParallelStateConflictError
    assert "'a' and 'b' both replace 'ReplaceWorker.value'" in seen["replace"].message
    assert type(seen["replace_and_reduce"]) is ParallelStateConflictError
    assert type(seen["single_writer"]) is ParallelStateConflictError
    assert "declares no state channel 'value'" in seen["undeclared"].message
    assert "not JSON-compatible" in seen["not_json"].message
    assert seen["untouched"] == {}
    state = public(next(s.state for s in doc.flow.steps if s.name == "ReplaceWorker"))
    assert state == {"score": 3, "value": 1, "owner": "b"}


async def test_a_field_removed_by_a_worker_is_removed_at_the_join():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        step.flow.save_step_state(ReplaceWorker, {"draft": "old", "kept": True})
        await step.run_steps([RunStepRequest(ReplaceWorker, params={"remove": ["draft"]})])
        seen["state"] = public(step.flow.get_step_state(ReplaceWorker))

    await run_scenario(scenario)
    assert seen["state"] == {"kept": True}


async def test_custom_reducers_and_failing_reducers():
    seen: dict[str, Any] = {}

    class Maxer(Step):
        def parallel_state_channels(self) -> dict:
            return {
                "best": StepChannels.reduced(max, initial=0),
                "broken": StepChannels.reduced(lambda current, value: current / value, initial=1),
            }

        async def run(self, user_message: str | None = None) -> Any:
            params = self.get_parallel_invocation().params
            self.contribute_state(params["channel"], params["value"])

    async def scenario(step: Step) -> None:
        await step.run_steps([
            RunStepRequest(Maxer, key=f"m{v}", params={"channel": "best", "value": v}) for v in (3, 9, 4)
        ])
        with pytest.raises(ParallelExecutionError) as caught:
            await step.run_steps([RunStepRequest(Maxer, params={"channel": "broken", "value": 0})])
        seen["error"] = caught.value.message
        seen["state"] = public(step.flow.get_step_state(Maxer))

    flow = flow_with(scenario)
    flow.define_steps = lambda self: [*ParallelFlow.define_steps(self), Maxer(self)]
    engine, _ = scripted_engine([flow], [])
    assert (await engine.run("ParallelFlow", "go")).success
    assert seen["state"] == {"best": 9}
    assert seen["error"].startswith("The reducer of channel 'Maxer.broken' failed: ZeroDivisionError")


async def test_nested_forks_see_the_parents_view_and_reach_the_session_only_through_the_outer_join():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        seen["ok"] = await step.run_steps(
            [RunStepRequest(NestedWorker), RunStepRequest(Inspector, key="c", params={"n": 10})]
        )
        seen["after_ok"] = public(step.flow.get_step_state(Inspector))
        step.flow.save_step_state(Inspector, {"observed": {}, "total": 0})
        seen["failed"] = await step.run_steps(
            [RunStepRequest(NestedWorker, params={"fail_after_join": True}), RunStepRequest(Inspector, key="c")]
        )
        seen["after_failed"] = public(step.flow.get_step_state(Inspector))

    doc, _ = await run_scenario(scenario)
    assert seen["ok"].branches[0].output == ["d", "e"]
    # d and e saw B's pre-fork change; the outer sibling c saw the canonical (empty) value.
    # Contributions reduce in request-path order: (0, 0), (0, 1), then (1,).
    assert seen["after_ok"] == {"observed": {"d": "pre-fork", "e": "pre-fork", "c": None}, "total": 13}
    states = {s.name: s.state for s in doc.flow.steps}
    # B saw its children's published state at the inner join, before the outer join.
    assert public(states["NestedWorker"]["inner_view"]) == {"observed": {"d": "pre-fork", "e": "pre-fork"}, "total": 3}
    # When B fails after its inner join, its descendants' state is discarded with it.
    assert [b.status for b in seen["failed"].branches] == ["rejected", "fulfilled"]
    # By then the first batch had published B's "before" field, so c saw it in its snapshot.
    assert seen["after_failed"] == {"observed": {"c": "pre-fork"}, "total": 0}
    levels = [(s.level, s.step_name) for s in doc.flow.sequence]
    assert levels[:5] == [(1, "Coordinator"), (2, "NestedWorker"), (3, "Inspector"), (3, "Inspector"), (2, "Inspector")]


async def test_run_step_inside_a_worker_is_an_isolated_one_child_barrier():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        seen["ok"] = await step.run_steps([RunStepRequest(ChildCaller, params={"child": "ProfileWorker"})])
        seen["failed"] = await step.run_steps([RunStepRequest(ChildCaller, key="x", params={"child": "FailingWorker"})])

    doc, _ = await run_scenario(scenario)
    assert seen["ok"].branches[0].output == "anon"
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["ChildCaller"]["child_state"]["profile"] == {"name": "anon"}
    assert states["ProfileWorker"]["profile"] == {"name": "anon"}
    failed = seen["failed"].branches[0]
    assert failed.status == "rejected" and isinstance(failed.error, ValueError)
    assert (2, "ChildCaller") in [(s.level, s.step_name) for s in doc.flow.sequence]
    assert (3, "ProfileWorker") in [(s.level, s.step_name) for s in doc.flow.sequence]


async def test_a_worker_tool_can_end_the_worker_with_direct_result():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        seen["batch"] = await step.run_steps(
            [
                RunStepRequest(InventoryWorker, key="shirt", params={"sku": "SHIRT-01"}, user_message="check"),
                RunStepRequest(InventoryWorker, key="hat", params={"sku": "HAT-02"}, user_message="check"),
            ],
            max_concurrency=2,
        )

    # Two replies only: a second model call after the tool would exhaust the script.
    doc, model = await run_scenario(scenario, [call(("report", {})), call(("report", {}))])
    assert [(b.key, b.output) for b in seen["batch"].fulfilled] == [
        ("shirt", {"sku": "SHIRT-01", "available": True}),
        ("hat", {"sku": "HAT-02", "available": False}),
    ]
    assert len(model.calls) == 2


async def test_direct_result_outside_a_worker_is_refused():
    class TopLevelInventory(InventoryWorker):
        @tool
        async def report(self, args: dict) -> Any:
            return direct_result({"sku": "SHIRT-01"})

    class InventoryFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [TopLevelInventory(self)]

    engine, _ = scripted_engine([InventoryFlow], [call(("report", {}))])
    response = await engine.run("InventoryFlow", "check")
    assert not response.success and response.message == public_message(response.error_code)
    assert response.detail == "direct_result() can only be returned by a tool handler of a run_steps() worker."


async def test_max_concurrency_bounds_the_running_workers():
    peaks = []

    async def scenario(step: Step) -> None:
        for limit in (2, None):
            RUNNING.update(now=0, max=0)
            await step.run_steps(
                [RunStepRequest(Sleeper, key=str(i)) for i in range(5)], max_concurrency=limit
            )
            peaks.append(RUNNING["max"])

    await run_scenario(scenario)
    assert peaks == [2, 5]


async def test_cancellation_stops_queued_work_and_running_workers_see_the_signal():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        signal = CancellationSignal()
        asyncio.get_running_loop().call_later(0.05, signal.cancel, "user left")
        seen["batch"] = await step.run_steps(
            [RunStepRequest(Sleeper, key=k, params={"cooperative": True}) for k in "abc"],
            max_concurrency=1,
            signal=signal,
        )

    doc, _ = await run_scenario(scenario)
    batch = seen["batch"]
    assert batch.cancelled and [b.status for b in batch.branches] == ["rejected"] * 3
    assert all(isinstance(b.error, ParallelCancelledError) for b in batch.branches)
    assert "before it started" in batch.branches[1].error.message
    # Only the first worker ever started.
    assert [(s.level, s.step_name) for s in doc.flow.sequence] == [(1, "Coordinator"), (2, "Sleeper")]


async def test_a_worker_ignoring_cancellation_loses_its_branch_after_the_grace_period():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        signal = CancellationSignal()
        asyncio.get_running_loop().call_later(0.02, signal.cancel)
        started = time.monotonic()
        seen["batch"] = await step.run_steps(
            [RunStepRequest(Sleeper, key="stubborn", params={"seconds": 5}), RunStepRequest(ProfileWorker)],
            signal=signal,
        )
        seen["elapsed"] = time.monotonic() - started

    await run_scenario(scenario, cancellation_grace_ms=30)
    stubborn, profile = seen["batch"].branches
    assert seen["elapsed"] < 1
    assert stubborn.status == "rejected" and "grace" in stubborn.error.message
    assert profile.status == "fulfilled"


async def test_a_cancelled_signal_abandons_a_running_model_call_without_recovery():
    seen: dict[str, Any] = {}

    class Patient(ModelWorker):
        async def on_llm_error(self, context: Any) -> Any:
            seen["recovered"] = True
            return "recovered"

    async def scenario(step: Step) -> None:
        signal = CancellationSignal()
        asyncio.get_running_loop().call_later(0.02, signal.cancel)
        started = time.monotonic()
        seen["batch"] = await step.run_steps([RunStepRequest(Patient, params={"topic": "x"}, user_message="hi")],
                                             signal=signal)
        seen["elapsed"] = time.monotonic() - started

    flow = flow_with(scenario)
    flow.define_steps = lambda self: [*ParallelFlow.define_steps(self), Patient(self)]
    engine, _ = scripted_engine([flow], [{"content": "too late", "delay": 5}])
    assert (await engine.run("ParallelFlow", "go")).success
    branch = seen["batch"].branches[0]
    assert branch.status == "rejected" and isinstance(branch.error, ParallelCancelledError)
    assert seen["elapsed"] < 1 and "recovered" not in seen


async def test_invocation_limits_are_enforced_across_nested_batches():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        with pytest.raises(ParallelExecutionError) as too_many:
            await step.run_steps([RunStepRequest(Sleeper, key=str(i)) for i in range(4)])
        seen["too_many"] = too_many.value.message
        # 2 outer + 2 nested invocations exceed the budget of 3 for one root batch.
        with pytest.raises(ParallelExecutionError) as nested:
            await step.run_steps([RunStepRequest(NestedWorker), RunStepRequest(ProfileWorker)])
        seen["nested"] = nested.value.message

    await run_scenario(scenario, max_invocations=3)
    assert seen["too_many"] == "run_steps() is limited to 3 invocations per root batch."
    assert seen["nested"] == seen["too_many"]


class RecordingStore(MemorySessionStore):
    def __init__(self, fail_first_save: bool = False) -> None:
        super().__init__()
        self.fail_first_save = fail_first_save
        self.saved: list[dict] = []

    async def save(self, doc, expected_revision):
        if self.fail_first_save:
            self.fail_first_save = False
            raise SessionStoreError("save", doc.id, "the table is unavailable")
        self.saved.append(doc.to_json_dict())
        return await super().save(doc, expected_revision)

    async def insert(self, doc):
        # A new session's first write (a checkpoint here) is its insert.
        if self.fail_first_save:
            self.fail_first_save = False
            raise SessionStoreError("insert", doc.id, "the table is unavailable")
        self.saved.append(doc.to_json_dict())
        return await super().insert(doc)


async def test_a_root_join_checkpoint_saves_immediately_and_rolls_back_when_the_save_fails():
    seen: dict[str, Any] = {}

    async def scenario(step: Step) -> None:
        seen["batch"] = await step.run_steps([RunStepRequest(ProfileWorker, params={"name": "Ada"})],
                                             checkpoint="root-join")

    store = RecordingStore()
    doc, _ = await run_scenario(scenario, store=store)
    assert seen["batch"].checkpointed
    assert doc.revision == 2
    checkpoint = {s["name"]: s["state"] for s in store.saved[0]["flow"]["steps"]}
    assert checkpoint["ProfileWorker"]["profile"] == {"name": "Ada"}

    async def failing(step: Step) -> str:
        with pytest.raises(SessionStoreError):
            await step.run_steps([RunStepRequest(ProfileWorker, params={"name": "Ada"})], checkpoint="root-join")
        seen["rolled_back"] = step.flow.get_step_state(ProfileWorker)
        return "recovered"

    doc, _ = await run_scenario(failing, store=RecordingStore(fail_first_save=True))
    assert seen["rolled_back"] == {}
    assert doc.revision == 1
    assert next(s.state for s in doc.flow.steps if s.name == "ProfileWorker") == {}


async def test_worker_helpers_refuse_to_run_outside_a_worker():
    errors = []

    async def scenario(step: Step) -> None:
        for attempt in (lambda: step.get_parallel_invocation(), lambda: step.contribute_state("x", 1)):
            with pytest.raises(PicoFlowError) as caught:
                attempt()
            errors.append(caught.value.message)
        batch = await step.run_steps([])
        errors.append((batch.branches, batch.published))

    await run_scenario(scenario)
    assert errors == [
        "Step 'Coordinator' is not running as a run_steps() worker.",
        "contribute_state() can only be called by a run_steps() worker on itself.",
        ((), False),
    ]


async def test_a_step_that_cannot_be_constructed_as_a_worker_fails_the_batch_before_anything_runs():
    seen: dict[str, Any] = {}

    class Configured(Step):
        def __init__(self, flow: Flow, catalog: dict) -> None:
            super().__init__(flow)
            self.catalog = catalog

    async def scenario(step: Step) -> None:
        with pytest.raises(ParallelExecutionError) as caught:
            await step.run_steps([RunStepRequest(ProfileWorker), RunStepRequest(Configured)])
        seen["message"] = caught.value.message
        seen["profile"] = dict(step.flow.get_step_state(ProfileWorker))

    flow = flow_with(scenario)
    flow.define_steps = lambda self: [*ParallelFlow.define_steps(self), Configured(self, {})]
    engine, _ = scripted_engine([flow], [])
    response = await engine.run("ParallelFlow", "go")
    assert response.success, response.message
    assert seen["message"].startswith("Cannot create a worker for step 'Configured': ")
    assert seen["profile"] == {}
    doc = await engine.session_store.load(response.session)
    assert [s.step_name for s in doc.flow.sequence] == ["Coordinator"]
