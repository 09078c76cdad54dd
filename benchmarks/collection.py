"""The profile-collection conversation of the turn-overhead and load benchmarks: script, model, PicoFlow flow.

Three stages (full name -> date of birth -> mailing address) over 20 user turns, with validation retries
both in code (a tool refuses the value and the model asks again) and in the model (it asks again without
calling a tool). ``benchmarks/collection_langgraph.py`` builds the same conversation as a LangGraph graph;
both sides use the zero-latency ``ReplayChatModel`` below with the same replies, the same prompts, the same
tool schemas and the same validators, so what differs between them is the framework.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field

from flows.basic.profile import AddressArgs, BirthDateArgs, NameArgs
from flows.basic.validators import InvalidInput, check_birth_date, check_full_name, parse_address
from picoflow import Flow, ModelSelection, Step, ToolSpec, Transition, finish, go, stay, tool
from picoflow.models.registry import ModelProvider

NAMESPACE = "profile"
PROVIDER = "replay"
MODEL = ModelSelection(provider=PROVIDER, name="replay-1")
USAGE = {"input_tokens": 180, "output_tokens": 24, "total_tokens": 204}

ROLE = (
    "You are a brief, courteous assistant collecting a customer profile one stage at a time. Call the stage's "
    "tool as soon as the user gives a usable value; the tool does the checking. If the tool refuses a value, "
    "explain why in your own words and ask again. Never invent values."
)
NAME_PROMPT = ROLE + "\n\nStage: full name. Ask for the user's first and last name, then call user_name."
DOB_PROMPT = (
    ROLE + "\n\nStage: date of birth. Ask {name} for their date of birth; read M/D/YYYY dates the U.S. way "
    "and call dob with the numeric year, month and day."
)
ADDRESS_PROMPT = (
    ROLE + "\n\nStage: mailing address. Ask for a U.S. address (street with a house number, city, two-letter "
    "state, ZIP code) and call address with exactly what the user typed."
)
CLOSING = "Thank you, {name}. Your profile is complete."


# -- tool schemas and domain checks (framework-free, used by both sides) -------------------------------------


# The argument models are BasicFlow's own, so both sides validate exactly what the bundled flow does.


TOOLS: dict[str, tuple[str, type[BaseModel]]] = {
    "user_name": ("Record the user's full name", NameArgs),
    "dob": ("Record a date of birth; read numeric slash dates as month/day/year", BirthDateArgs),
    "address": ("Record the user's mailing address", AddressArgs),
}


def accept_name(args: dict[str, Any]) -> str:
    return check_full_name(args["name"])


def accept_birth_date(args: dict[str, Any]) -> dict[str, int]:
    born = check_birth_date(args["year"], args["month"], args["day"])
    return {"year": born.year, "month": born.month, "day": born.day}


def accept_address(args: dict[str, Any]) -> dict[str, str]:
    return parse_address(args["address"]).as_dict()


# What the model is told when a tool refuses a value, after the validator's own reason.
FEEDBACK = {
    "user_name": "Ask for a different full name.",
    "dob": "Ask for a valid date of birth.",
    "address": "Ask for the street, city, two-letter state and ZIP code.",
}


def tool_definition(name: str) -> dict[str, Any]:
    """The OpenAI-style function definition of one of ``TOOLS``."""
    description, schema = TOOLS[name]
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema.model_json_schema()},
    }


# -- the conversation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One user message and the model replies it takes (a tool call is followed by one more reply)."""

    user: str
    replies: tuple[dict[str, Any], ...]


def _say(text: str) -> dict[str, Any]:
    return {"content": text}


def _call(tool_name: str, **args: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": tool_name, "args": args}]}


CONVERSATION: tuple[Turn, ...] = (
    Turn("Hi, I'd like to set up my profile.", (_say("Happy to help. What is your full name?"),)),
    Turn("Why do you need it?", (_say("Your full name goes on your profile and our letters. What is it?"),)),
    Turn("John Doe", (_call("user_name", name="John Doe"),
                      _say("That looks like a placeholder. Could you give me your real full name?"))),
    Turn("Ada", (_say("Thanks, Ada. Could I have your last name as well?"),)),
    Turn("Ada Lovelace", (_call("user_name", name="Ada Lovelace"),
                          _say("Thank you, Ada Lovelace. What is your date of birth?"))),
    Turn("Do I have to?", (_say("Yes, the profile needs a date of birth. What is it?"),)),
    Turn("December, I think", (_say("I need the whole date: month, day and year."),)),
    Turn("2/30/1985", (_call("dob", year=1985, month=2, day=30),
                       _say("February 30 does not exist. Could you check the date?"))),
    Turn("12/10/2085", (_call("dob", year=2085, month=12, day=10),
                        _say("That date is in the future. What is your actual date of birth?"))),
    Turn("Sorry, 12/10/1985", (_call("dob", year=1985, month=12, day=10),
                               _say("Thanks. What is your mailing address?"))),
    Turn("I live in London", (_say("I need a U.S. mailing address: street, city, state and ZIP code."),)),
    Turn("What format do you need?", (_say("For example: 12 Main St, Springfield, IL 62701."),)),
    Turn("12 Main St", (_say("Thanks. Which city, state and ZIP code?"),)),
    Turn("12 Main St, Springfield", (_say("And the two-letter state and the ZIP code?"),)),
    Turn("12 Main St, Springfield, ZZ 62701", (_call("address", address="12 Main St, Springfield, ZZ 62701"),
                                               _say("ZZ is not a U.S. state code. Which state is it?"))),
    Turn("Main St, Springfield, IL 62701", (_call("address", address="Main St, Springfield, IL 62701"),
                                            _say("The street needs a house number. What is the full address?"))),
    Turn("Can I use a PO box?", (_say("A street address with a house number works best. What is it?"),)),
    Turn("12 Main St, Springfield, IL", (_say("Almost there: what is the ZIP code?"),)),
    Turn("It's 62701, but is my data safe?", (_say("Yes, it is kept for your profile only. Please send the "
                                                   "whole address on one line."),)),
    # The accepted address ends the session with a fixed closing line: no second model call.
    Turn("12 Main St, Springfield, IL 62701", (_call("address", address="12 Main St, Springfield, IL 62701"),)),
)


def all_replies() -> list[dict[str, Any]]:
    return [reply for turn in CONVERSATION for reply in turn.replies]


# -- the zero-latency model -----------------------------------------------------------------------------


class ReplayScript:
    """The replies of one conversation, handed out in order; shared by every model built on it."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.cursor = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Start the conversation over (the benchmark replays it many times on one warm engine or graph)."""
        with self._lock:
            self.cursor = 0

    def take(self) -> AIMessage:
        with self._lock:
            if self.cursor >= len(self.replies):
                raise RuntimeError(f"The replay script ran out after {len(self.replies)} replies.")
            reply = self.replies[self.cursor]
            self.cursor += 1
            number = self.cursor
        calls = [
            {"name": call["name"], "args": dict(call["args"]), "id": f"call_{number}_{index}", "type": "tool_call"}
            for index, call in enumerate(reply.get("tool_calls") or [])
        ]
        # What a provider returns: the text or tool calls, token usage and a little response metadata.
        return AIMessage(
            content=reply["content"],
            tool_calls=calls,
            usage_metadata=dict(USAGE),
            response_metadata={"model_name": MODEL.name, "finish_reason": "tool_calls" if calls else "stop"},
        )


class ReplayChatModel(BaseChatModel):
    """A LangChain chat model answering instantly with the next reply of its script (no copies, no I/O)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: ReplayScript = Field(exclude=True)

    @property
    def _llm_type(self) -> str:
        return "replay"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.take())])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.script.take())])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        # Converting the tool definitions is what a real provider's bind_tools does too.
        return self.bind(tools=[convert_to_openai_tool(spec) for spec in tools], **kwargs)


class ReplayProvider(ModelProvider):
    """Serves PicoFlow's ``replay`` selections from one script."""

    name = PROVIDER

    def __init__(self, script: ReplayScript) -> None:
        self.model = ReplayChatModel(script=script)

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        return self.model


# -- the PicoFlow implementation ------------------------------------------------------------------------


def _spec(name: str) -> ToolSpec:
    description, schema = TOOLS[name]
    return ToolSpec(name=name, description=description, schema=schema)


class CollectNameStep(Step):
    def get_prompt(self) -> str:
        return NAME_PROMPT

    def define_tools(self) -> list[ToolSpec]:
        return [_spec("user_name")]

    @tool
    async def user_name(self, args: dict[str, Any]) -> Transition:
        try:
            name = accept_name(args)
        except InvalidInput as exc:
            return stay(f"{exc} {FEEDBACK['user_name']}")
        self.save_state({"name": name})
        return go(CollectBirthDateStep)


class CollectBirthDateStep(Step):
    def get_prompt(self) -> str:
        return DOB_PROMPT.format(name=self.flow.get_step_state(CollectNameStep, "name"))

    def define_tools(self) -> list[ToolSpec]:
        return [_spec("dob")]

    @tool
    async def dob(self, args: dict[str, Any]) -> Transition:
        try:
            born = accept_birth_date(args)
        except InvalidInput as exc:
            return stay(f"{exc} {FEEDBACK['dob']}")
        self.save_state(born)
        return go(CollectAddressStep)


class CollectAddressStep(Step):
    def get_prompt(self) -> str:
        return ADDRESS_PROMPT

    def define_tools(self) -> list[ToolSpec]:
        return [_spec("address")]

    @tool
    async def address(self, args: dict[str, Any]) -> Transition:
        try:
            parsed = accept_address(args)
        except InvalidInput as exc:
            return stay(f"{exc} {FEEDBACK['address']}")
        self.save_state({"address": parsed})
        return finish(CLOSING.format(name=self.flow.get_step_state(CollectNameStep, "name")))


class ProfileCollectionFlow(Flow):
    """Name, date of birth and address in one shared memory namespace."""

    def config_model(self) -> ModelSelection:
        return MODEL

    def define_steps(self) -> list[Step]:
        return [
            CollectNameStep(self).use_memory(NAMESPACE),
            CollectBirthDateStep(self).use_memory(NAMESPACE),
            CollectAddressStep(self).use_memory(NAMESPACE),
        ]
