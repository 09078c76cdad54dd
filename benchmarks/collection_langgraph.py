"""The profile-collection conversation of ``benchmarks/collection.py`` built directly on LangGraph.

A ``StateGraph`` with an ``agent`` node (the stage's prompt and tool, bound once when the graph is built)
and a ``tools`` node (schema validation, the same domain checks, the stage cursor), compiled with a
checkpointer so each ``invoke`` resumes the thread. Tool results carry the same texts PicoFlow's
``stay``/``go`` produce, so both implementations keep the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import ValidationError

from benchmarks.collection import (
    ADDRESS_PROMPT,
    CLOSING,
    DOB_PROMPT,
    FEEDBACK,
    NAME_PROMPT,
    TOOLS,
    InvalidInput,
    accept_address,
    accept_birth_date,
    accept_name,
    tool_definition,
)
from picoflow.authoring.transitions import TOOL_VALIDATED

# stage -> (its tool, the state key the accepted value goes to, the checker, the next stage)
STAGES: dict[str, tuple[str, str, Callable[[dict[str, Any]], Any], str]] = {
    "name": ("user_name", "name", accept_name, "dob"),
    "dob": ("dob", "birth_date", accept_birth_date, "address"),
    "address": ("address", "address", accept_address, "done"),
}


class ProfileState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    stage: str
    name: str
    birth_date: dict[str, int]
    address: dict[str, str]


def _prompt(state: ProfileState) -> str:
    stage = state.get("stage", "name")
    if stage == "name":
        return NAME_PROMPT
    if stage == "dob":
        return DOB_PROMPT.format(name=state.get("name"))
    return ADDRESS_PROMPT


def build_graph(model: BaseChatModel, checkpointer: BaseCheckpointSaver) -> Any:
    """The compiled graph: START -> agent -> (tools -> agent)* -> END."""
    bound = {stage: model.bind_tools([tool_definition(spec[0])]) for stage, spec in STAGES.items()}

    def agent(state: ProfileState) -> dict[str, Any]:
        stage = state.get("stage", "name")
        reply = bound[stage].invoke([SystemMessage(content=_prompt(state)), *state["messages"]])
        return {"messages": [reply]}

    def run_tools(state: ProfileState) -> dict[str, Any]:
        stage = state.get("stage", "name")
        tool_name, key, accept, next_stage = STAGES[stage]
        ai = state["messages"][-1]
        update: dict[str, Any] = {}
        messages: list[AnyMessage] = []
        for call in ai.tool_calls:
            if call["name"] != tool_name:
                messages.append(_tool_message(call, f"Unknown tool: {call['name']}", "error"))
                continue
            try:
                args = TOOLS[tool_name][1].model_validate(call["args"]).model_dump(mode="json")
            except ValidationError as exc:
                messages.append(_tool_message(call, f"Invalid arguments for tool '{tool_name}': {exc}", "error"))
                continue
            try:
                value = accept(args)
            except InvalidInput as exc:
                messages.append(_tool_message(call, f"{exc} {FEEDBACK[tool_name]}"))
                continue
            update[key] = value
            update["stage"] = next_stage
            messages.append(_tool_message(call, TOOL_VALIDATED))
            if next_stage == "done":
                messages.append(AIMessage(content=CLOSING.format(name=state.get("name"))))
        update["messages"] = messages
        return update

    def after_agent(state: ProfileState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    def after_tools(state: ProfileState) -> str:
        return END if state.get("stage") == "done" else "agent"

    graph = StateGraph(ProfileState)
    graph.add_node("agent", agent)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", after_agent, ["tools", END])
    graph.add_conditional_edges("tools", after_tools, ["agent", END])
    return graph.compile(checkpointer=checkpointer)


def _tool_message(call: dict[str, Any], content: str, status: str = "success") -> ToolMessage:
    return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"], status=status)


def reply_text(result: dict[str, Any]) -> str:
    """The assistant's answer for the turn: the last message of the state."""
    return str(result["messages"][-1].content)
