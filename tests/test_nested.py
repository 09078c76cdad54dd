"""Sequential nested execution: run_step() frames, the untouched cursor, sequence levels and refusals."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, go, stay, tool
from picoflow.errors import public_message
from tests.support.engine import call, scripted_engine, text

GOTO_REFUSAL = (
    "Cannot goto '{}' from a child execution frame. "
    "Return a result to the owning step instead."
)


class NameArgs(BaseModel):
    name: str


class NoArgs(BaseModel):
    pass


class NameStep(Step):
    def get_prompt(self) -> str:
        return "Collect the name."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="capture_name", description="Save the name", schema=NameArgs)]

    @tool
    async def capture_name(self, args: dict) -> object:
        self.save_state({"name": args["name"]})
        # A large intermediate result handed to the child for this request only.
        self.flow.save_transient_step_state(SummaryStep, {"draft": "x" * 5000, "name": args["name"]})
        answer = await self.run_step(SummaryStep)
        self.save_state({"summary": answer, "cursor_during_child": self.flow.get_session_doc().flow.current_step})
        return go(DoneStep)


class SummaryStep(Step):
    def get_prompt(self) -> str:
        draft = self.get_transient_state("draft") or ""
        return f"Summarise {self.get_transient_state('name')} from a draft of {len(draft)} characters."

    def on_crossing(self, message, prior_step=None):
        raise AssertionError("a nested child is entered without a crossing")

    async def on_enter(self) -> None:
        self.save_state({"events": [*(self.get_state("events") or []), "enter"]})
        self.save_state({"executing": self.flow.get_executing_step().id, "current": self.flow.get_current_step().id})

    async def on_exit(self) -> None:
        self.save_state({"events": [*self.get_state("events"), "exit"]})

    async def on_response(self, result):
        self.save_state({"last": result})
        return result


class DoneStep(Step):
    def get_prompt(self) -> str:
        return "Say you are done."


class NestedFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [
            NameStep(self).use_memory("default"),
            SummaryStep(self).use_memory("separate"),
            DoneStep(self).use_memory("default"),
        ]


async def test_run_step_returns_the_child_output_and_leaves_the_cursor_to_the_owner():
    engine, model = scripted_engine(
        [NestedFlow], [call(("capture_name", {"name": "Ada"})), text("Ada, in short."), text("All done.")]
    )
    response = await engine.run("NestedFlow", "I am Ada")
    assert response.success, response.message
    assert response.message == "All done."

    child_call = model.calls[1]
    # The transient value reached the child, and the child opened with no message at all.
    assert child_call[0].content == "Summarise Ada from a draft of 5000 characters."
    assert len(child_call) == 1

    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "DoneStep"
    assert [(s.level, s.step_name) for s in doc.flow.sequence] == [(1, "NameStep"), (2, "SummaryStep"), (1, "DoneStep")]
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["NameStep"]["summary"] == "Ada, in short."
    assert states["NameStep"]["cursor_during_child"] == "NameStep"
    child = states["SummaryStep"]
    assert child["events"] == ["enter", "exit"]
    assert (child["executing"], child["current"]) == ("SummaryStep", "NameStep")
    assert child["last"] == "Ada, in short."
    assert "_transient" not in child
    # The child wrote into its own namespace, not the owner's conversation.
    assert [m.content for m in doc.flow.memory["separate"].messages[1:]] == ["Ada, in short."]
    assert "Ada, in short." not in [m.content for m in doc.flow.memory["default"].messages]


class RoutingChild(Step):
    async def on_response(self, result):
        return DoneStep


class GotoChild(Step):
    async def run(self, user_message: str | None = None) -> object:
        await self.flow.goto(DoneStep)

    async def on_exit(self) -> None:
        self.flow.save_transient_step_state(GotoChild, {"exited": True})


class StayChild(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="check", description="Check", schema=NoArgs)]

    @tool
    async def check(self, args: dict) -> object:
        return stay("again")


class OwnerStep(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="delegate", description="Delegate", schema=NoArgs)]

    @tool
    async def delegate(self, args: dict) -> object:
        target = self.get_context("config.child")
        try:
            await self.run_step(target, "please compute")
        except Exception as exc:
            self.save_state({"error": str(exc), "cursor": self.flow.get_current_step().id})
            self.save_state({"child_exited": bool(self.flow.get_transient_step_state(GotoChild, "exited"))})
        return stay("done")


class RefusalFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [OwnerStep(self), RoutingChild(self), GotoChild(self), StayChild(self), DoneStep(self)]


async def _delegate(child: str, child_replies: list) -> dict:
    engine, _ = scripted_engine([RefusalFlow], [call(("delegate", {})), *child_replies, text("ok")])
    response = await engine.run("RefusalFlow", "go", config={"child": child})
    assert response.success, response.message
    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "OwnerStep"
    return next(s.state for s in doc.flow.steps if s.name == "OwnerStep")


async def test_goto_from_a_child_frame_is_refused_with_the_documented_error():
    state = await _delegate("GotoChild", [])
    assert state["error"] == GOTO_REFUSAL.format("DoneStep")
    assert state["cursor"] == "OwnerStep"
    assert state["child_exited"] is True


async def test_a_child_returning_a_step_from_on_response_is_refused():
    state = await _delegate("RoutingChild", [text("route me")])
    assert state["error"] == GOTO_REFUSAL.format("DoneStep")


async def test_a_child_may_stay_on_itself_so_its_tool_result_reaches_its_model():
    engine, model = scripted_engine([RefusalFlow], [call(("delegate", {})), call(("check", {})), text("checked"),
                                                    text("ok")])
    response = await engine.run("RefusalFlow", "go", config={"child": "StayChild"})
    assert response.success and response.message == "ok"
    doc = await engine.session_store.load(response.session)
    owner = next(s.state for s in doc.flow.steps if s.name == "OwnerStep")
    assert "error" not in owner and doc.flow.current_step == "OwnerStep"
    # The child's model saw its own tool call answered with the stay feedback.
    assert model.calls[2][-1].content == "again"


async def test_an_unregistered_child_is_refused():
    state = await _delegate("Missing", [])
    assert state["error"] == "Step 'Missing' is not defined in flow 'RefusalFlow'."


class LevelOne(Step):
    async def on_response(self, result):
        inner = await self.run_step(LevelTwo, "deeper")
        self.save_state({"inner": inner, "back_in": self.flow.get_executing_step().id})
        return f"{result}+{inner}"


class LevelTwo(Step):
    def get_prompt(self) -> str:
        return "level two"


class DeepOwner(Step):
    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="delegate", description="Delegate", schema=NoArgs)]

    @tool
    async def delegate(self, args: dict) -> object:
        self.save_state({"answer": await self.run_step(LevelOne, "start")})
        return stay()


class DeepFlow(Flow):
    depth = 8

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def config_parallel_execution(self) -> dict:
        return {"max_depth": self.depth}

    def define_steps(self) -> list[Step]:
        return [DeepOwner(self), LevelOne(self), LevelTwo(self)]


async def test_children_nest_with_increasing_sequence_levels_and_a_user_message():
    engine, model = scripted_engine([DeepFlow], [call(("delegate", {})), text("one"), text("two"), text("fine")])
    response = await engine.run("DeepFlow", "go")
    assert response.success, response.message
    doc = await engine.session_store.load(response.session)
    assert [(s.level, s.step_name) for s in doc.flow.sequence] == [(1, "DeepOwner"), (2, "LevelOne"), (3, "LevelTwo")]
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["DeepOwner"]["answer"] == "one+two"
    assert states["LevelOne"]["back_in"] == "LevelOne"
    assert [m.content for m in model.calls[2][1:]] == ["deeper"]


class ShallowFlow(DeepFlow):
    depth = 1


async def test_nesting_deeper_than_the_configured_limit_fails_the_turn():
    engine, _ = scripted_engine([ShallowFlow], [call(("delegate", {})), text("one")])
    response = await engine.run("ShallowFlow", "go")
    assert not response.success and response.message == public_message(response.error_code)
    assert response.detail == "Nested execution in flow 'ShallowFlow' is limited to a depth of 1."


class Left(Step):
    def get_prompt(self) -> str:
        return "left"


class Right(Step):
    def get_prompt(self) -> str:
        return "right"


class GatherOwner(Step):
    async def on_enter(self) -> None:
        left, right = await asyncio.gather(self.run_step(Left, "l"), self.run_step(Right, "r"))
        self.save_state({"pair": [left, right], "after": self.flow.get_executing_step().id})


class GatherFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [Starter(self), GatherOwner(self), Left(self), Right(self)]


class Starter(Step):
    async def on_response(self, result):
        return GatherOwner


async def test_execution_frames_are_per_task_so_concurrent_children_keep_their_own_step():
    # Left answers late and Right early: with a shared frame stack the late call would run as Right.
    engine, model = scripted_engine(
        [GatherFlow],
        [text("to owner"), {"content": "L", "delay": 0.05}, text("R"), text("owner")],
    )
    response = await engine.run("GatherFlow", "go")
    assert response.success, response.message
    # Whichever child called first got the slow reply; each answer must land with the child that asked.
    answers = {model.calls[1][0].content: "L", model.calls[2][0].content: "R"}
    assert set(answers) == {"left", "right"}
    doc = await engine.session_store.load(response.session)
    owner = next(s.state for s in doc.flow.steps if s.name == "GatherOwner")
    assert owner["pair"] == [answers["left"], answers["right"]]
    assert owner["after"] == "GatherOwner"
    assert doc.flow.memory["Left"].messages[-1].content == answers["left"]
    assert doc.flow.memory["Right"].messages[-1].content == answers["right"]
