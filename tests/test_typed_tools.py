"""Typed tools: a ``@tool`` handler whose argument is a pydantic model declares the tool by itself."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel, Field

from picoflow import Flow, ModelSelection, Step, TerminateSessionStep, ToolSpec, direct, go, stay, tool, tools
from picoflow.authoring.step_registry import collect_steps
from picoflow.authoring.step_tools import InvalidToolArguments, typed_tool_specs
from picoflow.errors import PicoFlowError
from tests.support.engine import call, scripted_engine, text


class BookArgs(BaseModel):
    hotel: str = Field(description="The hotel's name, as listed")
    nights: int = Field(ge=1, le=30)


class NoteArgs(BaseModel):
    note: str


class BookStep(Step):
    received: list[Any] = []

    def get_prompt(self) -> str:
        return "Book what the user asks for."

    @tool
    async def book_room(self, args: BookArgs) -> Any:
        """Book a room in one of the listed hotels.

        Longer notes for the reader of the code stay out of the tool's description.
        """
        BookStep.received.append(args)
        return go(DoneStep).with_state({"booked": args.hotel})

    @tool
    async def legacy_note(self, args: dict) -> Any:
        BookStep.received.append(args)
        return stay("noted")

    def define_tools(self) -> list[ToolSpec]:
        # An untyped handler still needs its ToolSpec; the typed one is kept through super().
        return [*super().define_tools(), ToolSpec(name="legacy_note", description="Take a note", schema=NoteArgs)]


class DoneStep(Step):
    def get_prompt(self) -> str:
        return "Confirm the booking."


class TypedFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [BookStep(self), DoneStep(self)]


async def test_a_typed_handler_declares_its_tool_and_receives_the_validated_model():
    BookStep.received = []
    engine, model = scripted_engine(
        [TypedFlow],
        [call(("legacy_note", {"note": "late arrival"})), call(("book_room", {"hotel": "Artemide", "nights": 2})),
         text("Booked.")],
    )
    response = await engine.run("TypedFlow", "Book the Artemide for two nights, I arrive late")
    assert response.success and response.message == "Booked."
    (note, booking) = BookStep.received
    assert note == {"note": "late arrival"}
    assert isinstance(booking, BookArgs) and (booking.hotel, booking.nights) == ("Artemide", 2)

    # Both tools were offered to the model; the typed one's definition came from its handler.
    assert sorted(model.tools[0]) == ["book_room", "legacy_note"]
    (spec,) = typed_tool_specs(BookStep)
    function = spec.as_model_tool()["function"]
    assert (function["name"], function["description"]) == ("book_room", "Book a room in one of the listed hotels.")
    assert function["parameters"]["properties"]["nights"]["maximum"] == 30


async def test_a_typed_handler_never_runs_on_invalid_arguments():
    BookStep.received = []
    engine, model = scripted_engine(
        [TypedFlow], [call(("book_room", {"hotel": "Artemide", "nights": 0})), text("How many nights?")]
    )
    response = await engine.run("TypedFlow", "Book the Artemide")
    assert response.message == "How many nights?" and BookStep.received == []
    assert "nights" in model.calls[1][-1].content


# -- a typed tool on a base step class ---------------------------------------------------------------------


class PickArgs(BaseModel):
    option: str


class ChooserStep(Step):
    """A base step: every chooser offers pick_option and moves on to its ``after`` step."""

    after = "DoneStep"

    def get_prompt(self) -> str:
        return "Let the user pick one option."

    @tool
    async def pick_option(self, args: PickArgs) -> Any:
        """Record the option the user picked."""
        self.save_state({"picked": args.option})
        return go(self.after)


class PlanChoiceStep(ChooserStep):
    after = "CarrierChoiceStep"


class CarrierChoiceStep(ChooserStep):
    pass


class ChoicesFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [PlanChoiceStep(self), CarrierChoiceStep(self), DoneStep(self)]


async def test_a_typed_tool_of_a_base_step_serves_every_registered_subclass():
    engine, model = scripted_engine(
        [ChoicesFlow],
        [call(("pick_option", {"option": "gold"})), call(("pick_option", {"option": "north"})), text("All set.")],
    )
    response = await engine.run("ChoicesFlow", "Gold plan, northern carrier")
    assert response.success and response.message == "All set."
    assert model.tools[:2] == [["pick_option"], ["pick_option"]]
    doc = await engine.session_store.load(response.session)
    picked = {step.name: step.state.get("picked") for step in doc.flow.steps}
    assert picked == {"PlanChoiceStep": "gold", "CarrierChoiceStep": "north", "DoneStep": None}


class EndableStep(Step):
    def get_prompt(self) -> str:
        return "Chat; end when asked."

    @tool
    async def terminate_session(self, args: TerminateSessionStep.TerminateArgs) -> Any:
        """End the chat."""
        return go("GoodbyeStep").with_prompt(args.prompt)


class GoodbyeStep(TerminateSessionStep):
    @tool
    async def terminate_session(self, args: TerminateSessionStep.TerminateArgs) -> Any:
        """End the chat (asked again while saying goodbye)."""
        return stay("Already ending.")


class EndingFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [EndableStep(self), GoodbyeStep(self).use_memory("end")]


async def test_typed_terminate_session_handlers_reuse_the_terminal_steps_definition():
    engine, model = scripted_engine(
        [EndingFlow], [call(("terminate_session", {"prompt": "Say a short goodbye."})), text("Goodbye!")]
    )
    response = await engine.run("EndingFlow", "That's all, thanks")
    assert response.success and response.completed and response.message == "Goodbye!"
    assert model.tools == [["terminate_session"], ["terminate_session"]]
    flow = EndingFlow()
    collect_steps(flow)
    assert flow.get_tool("terminate_session") == TerminateSessionStep(flow).define_tools()[-1]


class OtherPickArgs(BaseModel):
    choice: int


def test_two_schemas_for_one_tool_name_are_still_a_duplicate_with_a_hint():
    class NumberChoiceStep(Step):
        @tool
        async def pick_option(self, args: OtherPickArgs) -> Any:
            return None

    class ClashFlow(ChoicesFlow):
        def define_steps(self) -> list[Step]:
            return [PlanChoiceStep(self), NumberChoiceStep(self)]

    flow = ClashFlow()
    with pytest.raises(PicoFlowError) as raised:
        collect_steps(flow)
    assert str(raised.value) == (
        "Duplicate tool 'pick_option' registered in flow 'ClashFlow': declared by step 'PlanChoiceStep' (schema "
        "PickArgs) and by step 'NumberChoiceStep' (schema OtherPickArgs). Declare the tool once (in "
        "Flow.define_tools() or on a base step the handling steps share) and annotate every handler with that "
        "schema (or let it take no arguments), or rename one of the tools."
    )


# -- a tool without arguments ---------------------------------------------------------------------------------


class TableStep(Step):
    def get_prompt(self) -> str:
        return "Show the plan table when asked; end when asked."

    @tool
    async def show_table(self) -> Any:
        """Show the table of plans."""
        return direct("| plan | price |\n| --- | --- |\n| gold | 12 |")

    @tool
    async def terminate_session(self) -> Any:
        return go(TerminateSessionStep).with_prompt("Say goodbye.")


class TableFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [TableStep(self), TerminateSessionStep(self).use_memory("end")]


async def test_a_tool_without_arguments_is_declared_offered_and_called():
    engine, model = scripted_engine(
        [TableFlow],
        [call(("show_table", {})), call(("terminate_session", {"prompt": "bye"})), text("Goodbye!")],
    )
    first = await engine.run("TableFlow", "Show me the plans")
    assert first.success and first.message.startswith("| plan | price |")
    assert model.tools[0] == ["show_table", "terminate_session"]
    flow = TableFlow()
    collect_steps(flow)
    parameters = flow.get_tool("show_table").as_model_tool()["function"]["parameters"]
    assert (parameters["type"], parameters["properties"]) == ("object", {})
    # A handler without arguments also handles a tool defined elsewhere with arguments: it ignores them.
    assert flow.get_tool("terminate_session").schema is TerminateSessionStep.TerminateArgs

    second = await engine.run("TableFlow", "Thanks, that's all", first.session)
    assert second.success and second.completed and second.message == "Goodbye!"


# -- the step's own feedback for invalid arguments --------------------------------------------------------------


class DateArgs(BaseModel):
    day: dt.date


class MoveInStep(Step):
    saved: list[dt.date] = []

    def get_prompt(self) -> str:
        return "Ask for the move-in date and save it."

    @tool
    async def save_move_in(self, args: DateArgs) -> Any:
        MoveInStep.saved.append(args.day)
        return go(DoneStep)

    @tool
    async def save_move_out(self, args: DateArgs) -> Any:
        return stay("Saved.")

    async def on_invalid_tool_arguments(self, invalid: InvalidToolArguments) -> Any:
        if invalid.name == "save_move_in":
            return stay(f"Ask the user for the move-in date as YYYY-MM-DD ({invalid.problems}).")
        return "The move-out date must be a calendar date such as 2025-09-30."


class MoveInFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [MoveInStep(self), DoneStep(self)]


async def test_the_steps_own_feedback_for_invalid_arguments_reaches_the_model():
    MoveInStep.saved = []
    engine, model = scripted_engine(
        [MoveInFlow],
        [call(("save_move_in", {"day": "next Friday"}), ("save_move_out", {"day": "soon"})),
         text("Which date exactly (YYYY-MM-DD)?")],
    )
    response = await engine.run("MoveInFlow", "I move in next Friday")
    assert response.success and response.message == "Which date exactly (YYYY-MM-DD)?"
    assert MoveInStep.saved == []
    move_in, move_out = model.calls[1][-2:]
    assert isinstance(move_in, ToolMessage) and move_in.status == "error"
    assert move_in.content.startswith("Ask the user for the move-in date as YYYY-MM-DD (day: ")
    assert (move_out.status, move_out.content) == (
        "error", "The move-out date must be a calendar date such as 2025-09-30."
    )
    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "MoveInStep"


class AbruptMoveInStep(MoveInStep):
    async def on_invalid_tool_arguments(self, invalid: InvalidToolArguments) -> Any:
        return direct("Please type the move-in date as YYYY-MM-DD.")


class AbruptMoveInFlow(MoveInFlow):
    def define_steps(self) -> list[Step]:
        return [AbruptMoveInStep(self), DoneStep(self)]


async def test_the_steps_answer_to_invalid_arguments_may_be_a_direct_reply():
    engine, model = scripted_engine([AbruptMoveInFlow], [call(("save_move_in", {"day": "soon"}))])
    response = await engine.run("AbruptMoveInFlow", "I move in soon")
    assert response.success and response.message == "Please type the move-in date as YYYY-MM-DD."
    assert len(model.calls) == 1
    doc = await engine.session_store.load(response.session)
    stored = doc.flow.memory["AbruptMoveInStep"].messages
    # The call still gets its tool result (the default wording: a direct reply carries no feedback).
    assert stored[-2].content.startswith("Invalid arguments for tool 'save_move_in': day: ")


class CityArgs(BaseModel):
    city: str


class ForecastStep(Step):
    batches: list[list[dict[str, Any]]] = []

    @tool
    async def forecast(self, args: CityArgs) -> Any:
        """Forecast one city."""
        return stay("sunny")

    @tools(["forecast"])
    async def forecast_all(self, calls: list[dict[str, Any]]) -> Any:
        ForecastStep.batches.append([c["args"] for c in calls])
        return stay("all sunny")

    async def on_invalid_tool_arguments(self, invalid: InvalidToolArguments) -> Any:
        return f"Name the city to forecast ({invalid.problems})."


class ForecastFlow(MoveInFlow):
    def define_steps(self) -> list[Step]:
        return [ForecastStep(self)]


async def test_a_group_handlers_invalid_call_gets_the_steps_feedback_too():
    ForecastStep.batches = []
    engine, model = scripted_engine(
        [ForecastFlow], [call(("forecast", {"city": "Oslo"}), ("forecast", {"town": "Rome"})), text("Which city?")]
    )
    response = await engine.run("ForecastFlow", "weather in Oslo and that other place")
    assert response.message == "Which city?" and ForecastStep.batches == []
    not_run, invalid = model.calls[1][-2:]
    assert not_run.content == "Not run: another call in this batch had invalid arguments."
    assert invalid.content == "Name the city to forecast (city: Field required)."
