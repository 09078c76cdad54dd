"""Turn cost and stored size over a long conversation with memory compaction on: 10, 50, 200 and 1,000 turns.

Run: .venv/bin/python benchmarks/scaling_bench.py [--turns 1000]

The compacted concierge flow of ``benchmarks/growth_bench.py`` (each turn: a tool call recording the
guest's request, the tool result, the answer; compaction 16/8 with a summary model) runs one conversation of
1,000 turns on ``DynamoDBSessionStore`` against DynamoDB Local, and the same conversation on the store with
a client whose calls are free, turn by turn alternately, after 20 untimed warm-up turns. At each checkpoint
it reports the CPU per turn (median and mean of the 20 turns up to it, every thread of this process), the
part of it outside model calls, and what is stored: the session's JSON document, the DynamoDB item, the
messages kept verbatim. Goal: a turn's cost does not grow with the conversation's length.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402

from benchmarks.growth_bench import SENTENCE, CompactedFlow, SummaryAwareProvider, script  # noqa: E402
from benchmarks.metering import CpuMeter, FreeDynamoDBClient, MeteredChatModel, trace_as_deployed  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from picoflow import FlowEngine, ModelSelection  # noqa: E402
from picoflow.models.registry import ProviderRegistry  # noqa: E402
from picoflow.session.document import decode_document  # noqa: E402
from picoflow.session.dynamodb_store import (  # noqa: E402
    CLIENT_CONFIG,
    DynamoDBSessionStore,
    create_table,
    item_size,
)
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, running_dynamodb_local  # noqa: E402

TITLE = "Long conversations with compaction: turn cost and stored size (scaling_bench.py)"
COMMAND = ".venv/bin/python benchmarks/scaling_bench.py"
CHECKPOINTS = (10, 50, 200, 1000)
WINDOW = 20
# Untimed turns on a session of their own first, so the first checkpoint measures a warm process (connections
# open, models built) like the later ones rather than the process's first turn.
WARMUP = 20
GOAL = 1.25


class MeteredProvider(SummaryAwareProvider):
    """The growth benchmark's scripted provider, its chat models metered."""

    def __init__(self, replies: list[dict], meter: CpuMeter) -> None:
        super().__init__(replies)
        self.meter = meter

    def chat_model(self, selection: ModelSelection) -> Any:
        return MeteredChatModel(super().chat_model(selection), self.meter)


@dataclass
class Run:
    label: str
    engine: FlowEngine
    meter: CpuMeter
    client: Any
    table: str
    session: str | None = None
    cpu: list[float] = field(default_factory=list)
    model: list[float] = field(default_factory=list)
    stored: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def new_run(label: str, client: Any, table: str, turns: int, endpoint: str | None = None) -> Run:
    meter = CpuMeter()
    engine = FlowEngine(
        flows=[CompactedFlow],
        # On DynamoDB Local the store builds its own client as a deployment does; `client` reads the items back.
        session_store=(
            DynamoDBSessionStore(table, endpoint_url=endpoint, region_name=REGION)
            if endpoint
            else DynamoDBSessionStore(table, client=client)
        ),
        providers=ProviderRegistry(override=MeteredProvider(script(WARMUP + turns), meter)),
        retry_delay=0,
    )
    return Run(label, engine, meter, client, table)


def take_turn(run: Run, loop: asyncio.AbstractEventLoop, number: int, start_trace: Callable[[], None]) -> None:
    start_trace()
    run.meter.take()
    started = time.process_time()
    response = loop.run_until_complete(
        run.engine.run(CompactedFlow.id, f"Request {number}: {SENTENCE}", run.session)
    )
    cpu = time.process_time() - started
    if not response.success:
        raise SystemExit(f"{run.label}: turn {number} failed: {response.error_code} {response.detail}")
    run.session = response.session
    run.cpu.append(cpu * 1000)
    run.model.append(run.meter.take() * 1000)


def stored(run: Run) -> tuple[int, int, int]:
    """JSON bytes, DynamoDB item bytes and verbatim messages of the stored session."""
    item = run.client.get_item(TableName=run.table, Key={"id": {"S": run.session}})["Item"]
    raw = zlib.decompress(item["doc"]["B"])
    doc = decode_document(raw, int(item["revision"]["N"]))
    return len(raw), item_size(item), len(doc.flow.memory["concierge"].messages) - 1


def window(values: list[float], end: int) -> float:
    return statistics.median(values[max(0, end - WINDOW):end])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=max(CHECKPOINTS))
    args = parser.parse_args()
    os.environ.update(DUMMY_AWS_ENV)
    start_trace = trace_as_deployed()  # as the template deploys the function: X-Ray on botocore
    checkpoints = [c for c in CHECKPOINTS if c <= args.turns]
    loop = asyncio.new_event_loop()
    with running_dynamodb_local() as endpoint:
        client = boto3.session.Session().client(
            "dynamodb", endpoint_url=endpoint, region_name=REGION, config=CLIENT_CONFIG
        )
        table = f"picoflow-scaling-{uuid.uuid4().hex[:8]}"
        create_table(client, table)
        runs = [
            new_run("DynamoDB Local", client, table, args.turns, endpoint),
            new_run("store calls free", FreeDynamoDBClient(), "free", args.turns),
        ]
        for number in range(1, WARMUP + 1):
            for run in runs:
                take_turn(run, loop, number, start_trace)
        for run in runs:
            run.session, run.cpu, run.model = None, [], []
        for number in range(1, args.turns + 1):
            for run in runs:  # alternately, so machine noise hits both alike
                take_turn(run, loop, number, start_trace)
                if number in checkpoints:
                    run.stored[number] = stored(run)
    body = report(runs, checkpoints)
    print(body)
    write_section(TITLE, COMMAND, body)


def report(runs: list[Run], checkpoints: list[int]) -> str:
    real, free = runs
    rows = [
        "| turns | CPU ms/turn, DynamoDB Local (median; mean) | of which model calls (mean) "
        "| CPU ms/turn, store calls free (median; mean) | framework-only ms/turn (median; mean) | JSON bytes "
        "| item bytes | messages kept verbatim |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    framework = [cpu - model for cpu, model in zip(free.cpu, free.model, strict=True)]
    for turn in checkpoints:
        json_bytes, item_bytes, kept = real.stored[turn]
        rows.append(
            f"| {turn:,} | {window(real.cpu, turn):.2f}; {window_mean(real.cpu, turn):.2f} "
            f"| {window_mean(real.model, turn):.2f} | {window(free.cpu, turn):.2f}; {window_mean(free.cpu, turn):.2f} "
            f"| {window(framework, turn):.2f}; {window_mean(framework, turn):.2f} | {json_bytes:,} | {item_bytes:,} "
            f"| {kept} |"
        )
    first, last = checkpoints[0], checkpoints[-1]
    cpu_ratio = window_mean(real.cpu, last) / window_mean(real.cpu, first)
    framework_ratio = window_mean(framework, last) / window_mean(framework, first)
    size_ratio = real.stored[last][0] / real.stored[first][0]
    met = cpu_ratio <= GOAL and framework_ratio <= GOAL
    return "\n".join(rows) + (
        f"\n\nAt {last:,} turns a turn costs {cpu_ratio:.2f}x its CPU at {first} turns on DynamoDB Local "
        f"({framework_ratio:.2f}x framework-only; means of the {WINDOW} turns up to each checkpoint), and the "
        f"stored document is {size_ratio:.2f}x its size (goal: a turn's cost does not grow with the conversation, "
        f"at most {GOAL}x: {'met' if met else 'NOT met'}). Every turn records a tool call and answers; about one "
        "turn in two also folds older messages into the rolling summary (one more model call, the scripted "
        "summary model), so single turns come in two sizes and the table gives the median and the mean of the "
        f"{WINDOW} turns up to each checkpoint. CPU is `time.process_time()` of the whole process; model calls are "
        "metered around the scripted chat models (which copy each request, as the test double does). Both stores "
        f"first run {WARMUP} untimed turns of a warm-up conversation. Item bytes "
        "are DynamoDB's size of the stored item, the document zlib-compressed."
    )


def window_mean(values: list[float], end: int) -> float:
    return statistics.fmean(values[max(0, end - WINDOW):end])


if __name__ == "__main__":
    main()
