"""Tracing cost: CPU per turn with an OpenTelemetry SDK exporting to a no-op exporter, against no tracing at all.

Run: .venv/bin/python benchmarks/tracing_bench.py [--conversations 150]

HotelFlow's bundled conversation (14 turns: tool calls, the MCP search server over stdio, compactions, a booking)
is replayed through ``FlowEngine`` on the memory store with a scripted model, conversation after conversation in
one process. The two sides alternate in pairs (off, on, on, off, ...) after one warm-up conversation each, so machine
noise hits both alike. Every turn is timed with ``time.process_time``: CPU of every thread of the process, the
span processor's export thread included.

- ``off``: no SDK (what runs without ADOT or another SDK): the API's tracer, whose spans are no-ops.
- ``noop exporter``: the SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` (what ADOT and SDK deployments
  use: spans are queued in the turn and exported from a thread of their own) whose exporter drops every span
  (``picoflow.telemetry.set_tracer_provider`` switches between the two).

Reported: the median CPU per turn and per conversation of each side, their ratios, and the median of the ratios of
adjacent off/on conversation pairs. With no model latency, no network and no storage calls, a turn here is far
cheaper than a deployed one, so the share tracing takes is an upper bound.

Goal: tracing adds less than 5 % CPU per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from flows.hotel import HotelFlow  # noqa: E402
from picoflow import FlowEngine, telemetry  # noqa: E402
from picoflow.models.registry import ProviderRegistry  # noqa: E402
from picoflow.models.scripted import ScriptedProvider  # noqa: E402
from picoflow.stores import MemorySessionStore  # noqa: E402

GOAL = 0.05
CONVERSATION = json.loads((ROOT / "flows" / "hotel" / "conversation.json").read_text(encoding="utf-8"))


class DroppingExporter(SpanExporter):
    """Counts the spans it is handed and keeps none."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


async def conversation(engine: FlowEngine) -> list[float]:
    """CPU seconds of each turn of one conversation."""
    timings = []
    session = None
    for turn in CONVERSATION["turns"]:
        started = time.process_time()
        response = await engine.run(CONVERSATION["flow"], turn["user"], session, CONVERSATION["config"])
        timings.append(time.process_time() - started)
        if not response.success:
            raise SystemExit(f"turn failed: {response.error_code}")
        session = response.session
    return timings


async def measure(conversations: int) -> tuple[dict[str, list[list[float]]], int]:
    exporter = DroppingExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(BatchSpanProcessor(exporter))
    sides: dict[str, TracerProvider | None] = {"off": None, "noop exporter": sdk}
    replies = [reply for turn in CONVERSATION["turns"] for reply in turn["replies"]]
    provider = ScriptedProvider(replies * (2 * conversations + 2))
    engine = FlowEngine([HotelFlow], MemorySessionStore(), ProviderRegistry(override=provider))
    runs: dict[str, list[list[float]]] = {side: [] for side in sides}
    for index in range(2 * conversations + 2):
        # Alternate the order pair by pair: off, on, on, off, ...
        side = list(sides)[(index + index // 2) % 2]
        telemetry.set_tracer_provider(sides[side])
        gc.collect()
        timings = await conversation(engine)
        if index >= 2:
            runs[side].append(timings)
    telemetry.set_tracer_provider(None)
    sdk.force_flush()
    sdk.shutdown()
    traced_turns = (conversations + 1) * len(CONVERSATION["turns"])
    return runs, round(exporter.spans / traced_turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=150, help="measured conversations per side")
    args = parser.parse_args()

    runs, spans_per_turn = asyncio.run(measure(args.conversations))
    turns = {side: [t for timings in runs[side] for t in timings] for side in runs}
    per_conversation = {side: [sum(timings) for timings in runs[side]] for side in runs}
    off, on = (statistics.median(turns[side]) for side in runs)
    ratio = on / off
    conversation_ratio = statistics.median(per_conversation["noop exporter"]) / statistics.median(
        per_conversation["off"])
    # The n-th traced conversation against the n-th untraced one: neighbours in time, so under the same load.
    paired = statistics.median(
        traced / plain for plain, traced in zip(*per_conversation.values(), strict=True))
    verdict = "met" if max(ratio, conversation_ratio) - 1 < GOAL else "missed"
    rows = "\n".join(
        f"| {side} | {statistics.median(turns[side]) * 1000:.3f} | {statistics.mean(turns[side]) * 1000:.3f} | "
        f"{statistics.median(per_conversation[side]) * 1000:.1f} |"
        for side in runs
    )
    body = f"""
{args.conversations} measured HotelFlow conversations per side ({len(CONVERSATION["turns"])} turns each, after one
warm-up per side), alternating in pairs in one process, on the memory store with a scripted model; CPU time of the
whole process (`time.process_time`, the export thread included) per turn (1-minute load average at the end:
{os.getloadavg()[0]:.1f}). With the SDK (`BatchSpanProcessor`, an exporter that drops every span) a turn emits
{spans_per_turn} spans on average (turn, step runs, model and tool calls).

| tracing | CPU ms/turn (median) | mean | CPU ms/conversation (median) |
|---|---:|---:|---:|
{rows}

Tracing with the no-op exporter / no tracing, medians side by side: **{ratio:.3f}** per turn
({(ratio - 1) * 100:+.1f} %), **{conversation_ratio:.3f}** per conversation ({(conversation_ratio - 1) * 100:+.1f} %);
median of the {args.conversations} adjacent-pair ratios per conversation: {paired:.3f}.
Goal: under {GOAL:.0%} — {verdict}.
"""
    print(body)
    write_section("Tracing: CPU per turn with OpenTelemetry GenAI spans (tracing_bench.py)",
                  ".venv/bin/python benchmarks/tracing_bench.py", body)


if __name__ == "__main__":
    main()
