"""Typed tools: a ``@tool`` handler whose argument is a pydantic model declares the tool by itself."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from picoflow import Flow, ModelSelection, Step, ToolSpec, go, stay, tool
from picoflow.tools import typed_tool_specs
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
