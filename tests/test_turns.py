"""Whole turns on a scripted model: tools, transitions, crossings, logic steps, responses and completion."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, Field

from picoflow import (
    Flow,
    LogicStep,
    ModelSelection,
    Step,
    TerminateSessionStep,
    ToolSpec,
    direct,
    direct_to,
    finish,
    go,
    stay,
    tool,
    tools,
)
from picoflow.errors import public_message
from picoflow.messages import DirectMessage, HumanMessageEx, from_message_doc, message_step
from tests.support.engine import call, scripted_engine, text


class NameArgs(BaseModel):
    name: str = Field(min_length=1)


class CityArgs(BaseModel):
    city: str


class NoArgs(BaseModel):
    pass


class NameStep(Step):
    def get_prompt(self) -> str:
        return "Collect the user's full name."

    def define_tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(name="capture_name", description="Save the full name", schema=NameArgs),
            ToolSpec(name="show_card", description="Show a card", schema=NoArgs),
            ToolSpec(name="end_chat", description="End", schema=NoArgs),
        ]

    @tool
    async def capture_name(self, args: dict) -> object:
        if " " not in args["name"].strip():
            return stay("Please provide a full name.")
        self.save_state({"name": args["name"]})
        return go(DobStep).with_state({"greeting": f"Hi {args['name']}"})

    @tool("show_card")
    async def render_card(self, args: dict) -> object:
        return direct({"card": "name"}).with_content_type("application/json")

    @tool
    async def end_chat(self, args: dict) -> object:
        return go(TerminateSessionStep).with_prompt("Say goodbye.")


class DobStep(Step):
    def get_prompt(self) -> str:
        return f"Ask {self.flow.get_step_state(NameStep, 'name')} for their date of birth."


class BasicTestFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="model-a")

    def define_steps(self) -> list[Step]:
        return [
            NameStep(self).use_memory("default"),
            DobStep(self).use_memory("default"),
            TerminateSessionStep(self).use_memory("temp"),
        ]


async def load(engine, session_id):
    return await engine.session_store.load(session_id)


async def test_new_session_opens_with_start_and_user_message():
    engine, model = scripted_engine([BasicTestFlow], [text("What is your name?")])
    response = await engine.run("BasicTestFlow", "Hi", config={"tenant": "t1"})
    assert response.success and not response.completed
    assert response.message == "What is your name?"
    first_call = model.calls[0]
    assert isinstance(first_call[0], SystemMessage) and first_call[0].content == "Collect the user's full name."
    assert [m.content for m in first_call[1:]] == ["Start", "Hi"]
    assert model.tools[0] == ["capture_name", "show_card", "end_chat"]
    doc = await load(engine, response.session)
    assert doc.revision == 1
    assert doc.flow.current_step == "NameStep"
    assert doc.flow.context == {"config": {"tenant": "t1"}}
    assert [(s.level, s.step_name) for s in doc.flow.sequence] == [(1, "NameStep")]
    messages = doc.flow.memory["default"].messages
    assert [m.type for m in messages] == ["system", "human", "human", "ai"]
    assert all(m.id.startswith("NameStep|") for m in messages[1:])


async def test_stay_feeds_back_and_go_crosses_into_the_next_step_in_the_same_turn():
    engine, model = scripted_engine(
        [BasicTestFlow],
        [
            text("Your name?"),
            call(("capture_name", {"name": "Ada"})),
            call(("capture_name", {"name": "Ada Lovelace"})),
            text("When were you born, Ada Lovelace?"),
        ],
    )
    first = await engine.run("BasicTestFlow", "Hi")
    second = await engine.run("BasicTestFlow", "Ada", first.session)
    assert second.message == "When were you born, Ada Lovelace?"
    # The stay() feedback reached the model as the tool result of the first call.
    third_call = model.calls[2]
    assert isinstance(third_call[-1], ToolMessage)
    assert third_call[-1].content == "Please provide a full name."
    # After go(), the destination prompt is rebuilt from state and a synthetic opener is added.
    last_call = model.calls[3]
    assert last_call[0].content == "Ask Ada Lovelace for their date of birth."
    assert isinstance(last_call[-1], HumanMessage) and last_call[-1].content == "Start"
    doc = await load(engine, second.session)
    assert doc.flow.current_step == "DobStep"
    assert [s.step_name for s in doc.flow.sequence] == ["NameStep", "DobStep"]
    steps = {s.name: s.state for s in doc.flow.steps}
    assert steps["NameStep"]["name"] == "Ada Lovelace"
    assert steps["DobStep"]["greeting"] == "Hi Ada Lovelace"  # with_state lands on the destination
    tool_messages = [m for m in doc.flow.memory["default"].messages if m.type == "tool"]
    assert [(m.content, m.status) for m in tool_messages] == [
        ("Please provide a full name.", "success"),
        ("input validated", "success"),
    ]


async def test_direct_returns_exact_content_without_another_model_call():
    engine, model = scripted_engine([BasicTestFlow], [text("Your name?"), call(("show_card", {}))])
    first = await engine.run("BasicTestFlow", "Hi")
    second = await engine.run("BasicTestFlow", "card please", first.session)
    assert second.message == json.dumps({"card": "name"})
    assert second.content_type == "application/json"
    assert len(model.calls) == 2
    doc = await load(engine, first.session)
    last = doc.flow.memory["default"].messages[-1]
    assert last.type == "ai" and last.additional_kwargs == {"direct": True}


async def test_argument_validation_failure_goes_back_to_the_model():
    engine, model = scripted_engine(
        [BasicTestFlow], [text("Your name?"), call(("capture_name", {"name": ""})), text("Please tell me your name.")]
    )
    first = await engine.run("BasicTestFlow", "Hi")
    second = await engine.run("BasicTestFlow", "...", first.session)
    assert second.success and second.message == "Please tell me your name."
    feedback = model.calls[2][-1]
    assert isinstance(feedback, ToolMessage) and feedback.status == "error"
    assert "capture_name" in feedback.content and "name" in feedback.content
    assert (await load(engine, first.session)).flow.current_step == "NameStep"


async def test_hallucinated_and_unhandled_tools_warn_and_continue():
    class LooseStep(Step):
        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="lookup", description="Look something up", schema=CityArgs)]

        def use_tools(self) -> list[str]:
            # Offered only under a request's config: registration refuses a tool offered without a handler.
            return ["lookup"] if self.get_context("config.loose") else []

    class LooseFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [LooseStep(self)]

    engine, model = scripted_engine(
        [LooseFlow], [call(("lookup", {"city": "Paris"}), ("invented", {"x": 1})), text("done")]
    )
    response = await engine.run("LooseFlow", "go", config={"loose": True})
    assert response.success and response.message == "done"
    results = [m for m in model.calls[1] if isinstance(m, ToolMessage)]
    assert [(m.name, m.content) for m in results] == [
        ("lookup", "input validated"),
        ("invented", "LLM hallucinates a non-existing tool: invented"),
    ]
    doc = await load(engine, response.session)
    assert [w.message for w in doc.warn] == ["missing tool handler: lookup", "hallucinated tool: invented"]


class WeatherStep(Step):
    batches: list = []

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="get_weather", description="Weather for a city", schema=CityArgs)]

    @tool
    async def get_weather(self, args: dict) -> object:
        raise AssertionError("the group handler is authoritative")

    @tools(["get_weather"])
    async def all_weather(self, calls: list) -> object:
        WeatherStep.batches.append([c["args"] for c in calls])
        return stay("sunny everywhere")


class WeatherFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [WeatherStep(self)]


async def test_group_handler_receives_every_call_once_and_answers_each():
    WeatherStep.batches.clear()
    engine, model = scripted_engine(
        [WeatherFlow], [call(("get_weather", {"city": "LA"}), ("get_weather", {"city": "NYC"})), text("ok")]
    )
    response = await engine.run("WeatherFlow", "weather?")
    assert response.message == "ok"
    assert WeatherStep.batches == [[{"city": "LA"}, {"city": "NYC"}]]
    results = [m for m in model.calls[1] if isinstance(m, ToolMessage)]
    assert len({m.tool_call_id for m in results}) == 2
    assert all(m.content == "sunny everywhere" for m in results)


@pytest.mark.parametrize(
    ("returned", "error"),
    [(None, "returned None"), ("", "empty step name"), (3, "unsupported int"), ({"x": 1}, "without step")],
)
async def test_group_handler_must_return_a_route(returned, error):
    class GroupStep(Step):
        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="a", description="a", schema=NoArgs)]

        def use_tools(self) -> list[str]:
            return ["a"]

        @tools(["a"])
        async def handle(self, calls: list) -> object:
            return returned

    class GroupFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [GroupStep(self)]

    engine, _ = scripted_engine([GroupFlow], [call(("a", {}))])
    response = await engine.run("GroupFlow", "x")
    assert not response.success and error in response.detail
    assert response.message == public_message(response.error_code)
    assert (await load(engine, response.session)).run_status == "aborted"


async def test_failing_handler_aborts_the_session_and_a_new_request_starts_over():
    class BoomStep(Step):
        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="boom", description="fails", schema=NoArgs)]

        @tool
        async def boom(self, args: dict) -> object:
            raise RuntimeError("backend exploded")

    class BoomFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [BoomStep(self)]

    engine, _ = scripted_engine([BoomFlow], [call(("boom", {})), text("fresh start")])
    failed = await engine.run("BoomFlow", "x")
    assert not failed.success and not failed.completed
    assert failed.error_code == "TURN_FAILED" and failed.status_code == 500
    assert failed.message == public_message("TURN_FAILED")
    assert "backend exploded" in failed.detail
    doc = await load(engine, failed.session)
    assert doc.run_status == "aborted"
    assert doc.error[0].message == "backend exploded"
    again = await engine.run("BoomFlow", "again", failed.session)
    assert again.success and again.session != failed.session


async def test_terminate_session_step_completes_and_a_completed_session_is_not_resumed():
    engine, model = scripted_engine(
        [BasicTestFlow], [text("Your name?"), call(("end_chat", {})), text("Goodbye!"), text("Your name?")]
    )
    first = await engine.run("BasicTestFlow", "Hi")
    bye = await engine.run("BasicTestFlow", "bye", first.session)
    assert bye.success and bye.completed and bye.message == "Goodbye!"
    assert model.calls[2][0].content == "Say goodbye."
    assert model.calls[2][-1].content == "I'm done with chat"
    doc = await load(engine, first.session)
    assert doc.run_status == "completed" and doc.flow.current_step == "TerminateSessionStep"
    fresh = await engine.run("BasicTestFlow", "Hi again", first.session)
    assert fresh.success and fresh.session != first.session
    assert (await load(engine, first.session)).run_status == "completed"  # the old document is kept


class RouteLogic(LogicStep):
    async def run_logic(self) -> object:
        return go(SecondLogic).with_state({"from": "RouteLogic"})


class SecondLogic(LogicStep):
    async def run_logic(self) -> object:
        return go(AnswerStep).with_prompt("Answer briefly.").with_message(HumanMessageEx("SecondLogic", "Go on"))


class AnswerStep(Step):
    pass


class LogicFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [RouteLogic(self), SecondLogic(self), AnswerStep(self)]


async def test_logic_steps_chain_to_a_model_step_in_one_turn():
    engine, model = scripted_engine([LogicFlow], [text("answered")])
    response = await engine.run("LogicFlow", "hello")
    assert response.message == "answered"
    assert model.calls[0][0].content == "Answer briefly."
    assert model.calls[0][-1].content == "Go on"
    doc = await load(engine, response.session)
    assert [s.step_name for s in doc.flow.sequence] == ["RouteLogic", "SecondLogic", "AnswerStep"]
    assert doc.flow.memory["RouteLogic"].messages[-1].content == "hello"
    assert doc.flow.memory["SecondLogic"].messages[-1].content == "Continue to step:SecondLogic"
    steps = {s.name: s for s in doc.flow.steps}
    assert steps["SecondLogic"].state["from"] == "RouteLogic"
    assert steps["RouteLogic"].model is None


async def test_a_logic_step_that_does_not_move_is_an_error_not_a_loop():
    class StuckLogic(LogicStep):
        async def run_logic(self) -> object:
            return StuckLogic

    class StuckFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [StuckLogic(self)]

    engine, _ = scripted_engine([StuckFlow], [])
    response = await engine.run("StuckFlow", "x")
    assert not response.success and "must move the cursor" in response.detail
    assert response.message == public_message(response.error_code)


class Movie(BaseModel):
    title: str
    year: int


class ExtractStep(Step):
    def struct_output_schema(self) -> type[BaseModel]:
        return Movie

    async def on_response(self, result: object) -> object:
        assert isinstance(result, Movie)
        self.save_state({"movie": result.model_dump()})
        return go(ReplyStep)


class ReplyStep(Step):
    def get_prompt(self) -> str:
        return f"Talk about {self.flow.get_step_state(ExtractStep, 'movie.title')}."


class ExtractFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="m")

    def define_steps(self) -> list[Step]:
        return [ExtractStep(self), ReplyStep(self)]


async def test_structured_output_reaches_on_response_which_routes():
    engine, model = scripted_engine(
        [ExtractFlow], [text('```json\n{"title": "Alien", "year": 1979}\n```'), text("A classic.")]
    )
    response = await engine.run("ExtractFlow", "Alien (1979)")
    assert response.message == "A classic."
    assert model.calls[1][0].content == "Talk about Alien."
    doc = await load(engine, response.session)
    assert {s.name: s.state for s in doc.flow.steps}["ExtractStep"]["movie"] == {"title": "Alien", "year": 1979}
    assert doc.tokens.input_tokens == 20 and doc.tokens.output_tokens == 10


async def test_check_response_true_retries_and_rejected_output_is_not_stored():
    class PickyStep(Step):
        def check_response(self, result: object) -> bool:
            return "bad" in result.content

    class PickyFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [PickyStep(self)]

    engine, model = scripted_engine([PickyFlow], [text("bad answer"), text("good answer")])
    response = await engine.run("PickyFlow", "q")
    assert response.message == "good answer" and len(model.calls) == 2
    doc = await load(engine, response.session)
    assert [m.content for m in doc.flow.memory["PickyStep"].messages if m.type == "ai"] == ["good answer"]
    assert doc.tokens.input_tokens == 20  # the rejected attempt is billed too


async def test_empty_responses_are_nudged_then_exhaust_the_attempts():
    class PlainStep(Step):
        pass

    class PlainFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m", retry_attempts=2)

        def define_steps(self) -> list[Step]:
            return [PlainStep(self)]

    engine, model = scripted_engine([PlainFlow], [text(""), text("   "), text("finally")])
    response = await engine.run("PlainFlow", "q")
    assert not response.success and response.detail.startswith("LLM call failed. Reason:")
    assert (response.error_code, response.status_code) == ("MODEL_UNAVAILABLE", 502)
    assert response.message == public_message("MODEL_UNAVAILABLE") and response.retry_after == 5
    assert model.calls[1][-1].content == "Follow system prompt and respond properly."
    doc = await load(engine, response.session)
    assert (doc.revision, doc.run_status) == (0, "running")  # nothing of the failed turn is kept
    again = await engine.run("PlainFlow", "q", response.session)
    assert again.success and again.message == "finally" and again.session == response.session


async def test_model_errors_are_retried_within_the_budget():
    class PlainStep(Step):
        pass

    class PlainFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [PlainStep(self)]

    engine, model = scripted_engine([PlainFlow], [{"error": "rate limited"}, {"error": "again"}, text("finally")])
    response = await engine.run("PlainFlow", "q")
    assert response.message == "finally" and len(model.calls) == 3
    doc = await load(engine, response.session)
    assert [w.message for w in doc.warn] == ["model attempt failed", "model attempt failed"]


async def test_on_response_can_route_by_step_name_and_crossing_sees_the_prior_step():
    class FirstStep(Step):
        async def on_response(self, result: object) -> object:
            return "SecondStep" if result == "route" else result

    class SecondStep(Step):
        crossings: list = []

        def on_crossing(self, message, prior_step=None):
            SecondStep.crossings.append(prior_step)
            return HumanMessageEx(self, "Summarise.")

    class RouteFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [FirstStep(self), SecondStep(self)]

    engine, model = scripted_engine([RouteFlow], [text("route"), text("summary")])
    response = await engine.run("RouteFlow", "hi")
    assert response.message == "summary"
    assert SecondStep.crossings == ["FirstStep"]
    assert model.calls[1][-1].content == "Summarise."


async def test_direct_to_and_finish():
    class FinishArgs(BaseModel):
        done: bool

    class DeskStep(Step):
        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="hand_off", description="x", schema=NoArgs),
                    ToolSpec(name="wrap_up", description="y", schema=FinishArgs)]

        @tool
        async def hand_off(self, args: dict) -> object:
            return direct_to(ReviewDesk, "A reviewer will follow up.")

        @tool
        async def wrap_up(self, args: dict) -> object:
            return finish("All done.")

    class ReviewDesk(Step):
        entered: list = []

        async def on_enter(self) -> None:
            ReviewDesk.entered.append(True)

    class DeskFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [DeskStep(self), ReviewDesk(self)]

    engine, _ = scripted_engine([DeskFlow], [call(("hand_off", {}))])
    moved = await engine.run("DeskFlow", "help")
    assert moved.message == "A reviewer will follow up." and not moved.completed
    doc = await load(engine, moved.session)
    assert doc.flow.current_step == "ReviewDesk" and ReviewDesk.entered == [True]
    assert doc.flow.memory["ReviewDesk"].messages[-1].additional_kwargs == {"direct": True}

    engine, _ = scripted_engine([DeskFlow], [call(("wrap_up", {"done": True}))])
    done = await engine.run("DeskFlow", "finish")
    assert done.message == "All done." and done.completed
    doc = await load(engine, done.session)
    assert doc.run_status == "completed" and doc.flow.current_step == "DeskStep"


async def test_stay_and_direct_outside_a_tool_handler_raise():
    from picoflow.errors import PicoFlowError

    with pytest.raises(PicoFlowError):
        stay()
    with pytest.raises(PicoFlowError):
        direct("x")
    assert go("  NameStep ").step == "NameStep"
    with pytest.raises(PicoFlowError):
        go("  ")


async def test_builders_are_immutable():
    base = go(NameStep)
    with_prompt = base.with_prompt("p")
    assert base.prompt is None and with_prompt.prompt == "p"
    assert with_prompt.with_state({"a": 1}).prompt == "p"
    message = DirectMessage("NameStep", {"a": 1})
    assert isinstance(message, AIMessage) and message.content == '{"a": 1}'


async def test_group_handler_calls_are_validated_before_the_handler_runs():
    WeatherStep.batches.clear()
    engine, model = scripted_engine(
        [WeatherFlow],
        [call(("get_weather", {"city": "LA"}), ("get_weather", {"town": "NYC"})),
         call(("get_weather", {"city": "LA"}), ("get_weather", {"city": "NYC"})), text("done")],
    )
    response = await engine.run("WeatherFlow", "weather?")
    assert response.message == "done"
    first_results = [m for m in model.calls[1] if isinstance(m, ToolMessage)]
    assert [m.status for m in first_results] == ["error", "error"]
    assert "Invalid arguments for tool 'get_weather'" in first_results[1].content
    assert first_results[0].content.startswith("Not run")
    assert WeatherStep.batches == [[{"city": "LA"}, {"city": "NYC"}]]


async def test_tool_handlers_get_a_stable_idempotency_key_per_session_and_call():
    class PayArgs(BaseModel):
        amount: int

    class PayStep(Step):
        keys: list = []

        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="pay", description="Charge the card", schema=PayArgs),
                    ToolSpec(name="refund", description="Refund", schema=PayArgs)]

        @tool
        async def pay(self, args: dict) -> object:
            PayStep.keys.append(("pay", self.tool_idempotency_key()))
            return stay("charged")

        def use_tools(self) -> list[str]:
            return ["refund"]

        @tools(["refund"])
        async def refunds(self, calls: list) -> object:
            PayStep.keys.extend(("refund", self.tool_idempotency_key(c)) for c in calls)
            return stay("refunded")

    class PayFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [PayStep(self)]

    def script() -> list:
        return [
            {"content": "", "tool_calls": [{"name": "pay", "args": {"amount": 5}, "id": "call-1"},
                                           {"name": "pay", "args": {"amount": 5}, "id": "call-2"}]},
            {"content": "", "tool_calls": [{"name": "refund", "args": {"amount": 5}, "id": "call-1"}]},
            text("done"),
        ]

    engine, _ = scripted_engine([PayFlow], script())
    first = await engine.run("PayFlow", "pay twice")
    keys = list(PayStep.keys)
    assert [kind for kind, _ in keys] == ["pay", "pay", "refund"]
    assert len({key for _, key in keys}) == 3 and all(len(key) == 32 for _, key in keys)
    # The same calls in another session give other keys; the same session and call give the same key.
    PayStep.keys.clear()
    engine2, _ = scripted_engine([PayFlow], script())
    second = await engine2.run("PayFlow", "pay twice")
    assert second.session != first.session
    assert not {key for _, key in PayStep.keys} & {key for _, key in keys}
    step = PayStep(engine.get_flow("PayFlow")())
    from picoflow.errors import PicoFlowError

    with pytest.raises(PicoFlowError, match="inside a tool handler"):
        step.tool_idempotency_key()


class ClosingLogic(LogicStep):
    async def run_logic(self) -> object:
        return finish("Closed by the logic step.")


class ClosingStep(Step):
    async def on_response(self, result: Any) -> Any:
        return finish(f"Closed after: {result}")


async def test_finish_outside_a_tool_is_attributed_to_the_step_that_finished():
    class ClosingFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="scripted", name="m")

        def define_steps(self) -> list[Step]:
            return [ClosingLogic(self)]

    class AnswerClosingFlow(ClosingFlow):
        def define_steps(self) -> list[Step]:
            return [ClosingStep(self)]

    engine, _ = scripted_engine([ClosingFlow, AnswerClosingFlow], [text("the answer")])
    for flow_name, step_id, reply in [
        ("ClosingFlow", "ClosingLogic", "Closed by the logic step."),
        ("AnswerClosingFlow", "ClosingStep", "Closed after: the answer"),
    ]:
        response = await engine.run(flow_name, "close it")
        assert (response.success, response.completed, response.message) == (True, True, reply)
        closing = (await load(engine, response.session)).flow.memory[step_id].messages[-1]
        assert closing.content == reply and message_step(from_message_doc(closing)) == step_id
