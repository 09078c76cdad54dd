"""Fan-out: run_steps() over 20 workers whose scripted model answers after 100 ms, against the same work in sequence.

Run: .venv/bin/python benchmarks/fanout_bench.py [--runs 7] [--workers 20] [--delay 0.1]

Each run is one engine turn on the in-memory store. The parallel side times ``run_steps()`` (fork, the
workers' model calls, the request-order join); the sequential side times the same children run one after
another with ``run_step()``. Runs alternate between the two sides so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from picoflow import Flow, ModelSelection, Step  # noqa: E402
from picoflow.authoring.step_runs import RunStepRequest, StepChannels  # noqa: E402
from tests.support.engine import scripted_engine  # noqa: E402


class Summariser(Step):
    def get_prompt(self) -> str:
        return "Summarise the item in one line."

    def parallel_state_channels(self) -> dict[str, Any]:
        return {"summaries": StepChannels.keyed_by_branch()}

    async def on_response(self, result: Any) -> Any:
        if self.flow.get_context("config.mode") == "parallel":
            self.contribute_state("summaries", result)
        return result


class Coordinator(Step):
    async def run(self, user_message: str | None = None) -> Any:
        workers = self.get_context("config.workers")
        started = time.perf_counter()
        if self.get_context("config.mode") == "parallel":
            batch = await self.run_steps(
                [RunStepRequest(Summariser, key=f"w{i}", user_message=f"item {i}") for i in range(workers)],
                max_concurrency=workers,
            )
            assert len(batch.fulfilled) == workers, batch.rejected
        else:
            for i in range(workers):
                await self.run_step(Summariser, f"item {i}")
        return str(time.perf_counter() - started)


class FanoutFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="bench")

    def define_steps(self) -> list[Step]:
        return [Coordinator(self), Summariser(self)]


async def measure(mode: str, workers: int, delay: float) -> float:
    replies = [{"content": f"summary {i}", "delay": delay} for i in range(workers)]
    engine, _ = scripted_engine([FanoutFlow], replies)
    response = await engine.run("FanoutFlow", "go", config={"mode": mode, "workers": workers})
    assert response.success, response.message
    return float(response.message)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.1)
    args = parser.parse_args()
    parallel, sequential = [], []
    for _ in range(args.runs):
        parallel.append(await measure("parallel", args.workers, args.delay))
        sequential.append(await measure("sequential", args.workers, args.delay))
    par, seq = statistics.median(parallel), statistics.median(sequential)
    ratio = par / seq
    body = (
        "| measure | median ms |\n|---|---:|\n"
        f"| run_steps(), {args.workers} workers, max_concurrency={args.workers} | {par * 1000:.0f} |\n"
        f"| the same {args.workers} children in sequence (run_step) | {seq * 1000:.0f} |\n"
        f"| ideal sequential sum ({args.workers} x {args.delay * 1000:.0f} ms model latency) "
        f"| {args.workers * args.delay * 1000:.0f} |\n\n"
        f"Parallel / sequential = {ratio:.3f} (goal: under 0.15: {'met' if ratio < 0.15 else 'NOT met'}); "
        f"medians of {args.runs} interleaved runs. Each worker makes one scripted model call that answers after "
        f"{args.delay * 1000:.0f} ms; the parallel figure includes the fork (state snapshot, a fresh worker per "
        "request) and the join (keyed_by_branch reduction in request order)."
    )
    print(body)
    write_section("Fan-out (fanout_bench.py)", "python benchmarks/fanout_bench.py", body)


if __name__ == "__main__":
    asyncio.run(main())
