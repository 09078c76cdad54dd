"""Peak memory of a function process over a 20-turn conversation, and the Lambda cost per 1,000 turns.

Run: .venv/bin/python benchmarks/memory_bench.py [--runs 3]

Each run is a fresh process doing what a Lambda container does, as ``template.yaml`` deploys it: it imports
``handlers.api`` (primed at init, ``AWS_LAMBDA_INITIALIZATION_TYPE=on-demand``; also without priming), then serves
the 20-turn profile collection of ``benchmarks/collection.py`` on ``gpt-4o`` (``benchmarks/memory_flow.py``; 27
model calls) through the handler: sessions in
DynamoDB (DynamoDB Local), ``ChatOpenAI`` over HTTP on loopback (``benchmarks/replay_openai.py`` in a process of
its own). It reports the process's peak resident set (``ru_maxrss``) after init and after the 20 turns, and each
turn's CPU (``time.process_time``, every thread).

Cost model: Lambda bills memory x duration. A function with M MB gets M/1,769 of a vCPU below 1,769 MB, so a
turn's CPU work takes its CPU time x 1,769/M of wall time there (at least its CPU time); waits for the model and
DynamoDB are left out (they do not shrink or grow with memory, and each second of them costs M/1,024 GB-s).
Prices: Lambda on-demand duration in us-east-1 (first pricing tier, as listed in 2025): arm64 (as deployed)
$0.0000133334 and x86_64 $0.0000166667 per GB-second, plus $0.20 per million requests. The CPU times of this
machine stand in for a Lambda vCPU's. Goal: peak RSS over 20 turns at most 180 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.collection import CONVERSATION  # noqa: E402
from benchmarks.memory_flow import OpenAICollectionFlow  # noqa: E402
from benchmarks.replay_openai import ReplayServerProcess, ServerScript  # noqa: E402
from benchmarks.results import write_section  # noqa: E402

TITLE = "Function memory and Lambda cost per 1,000 turns (memory_bench.py)"
COMMAND = ".venv/bin/python benchmarks/memory_bench.py"
GOAL_MB = 180
FULL_VCPU_MB = 1769
MEMORY_SIZES = (256, 512, 1024)
PRICE_PER_GB_SECOND = {"arm64": 0.0000133334, "x86_64": 0.0000166667}
PRICE_PER_REQUEST = 0.20 / 1_000_000

# One container: init, then the conversation; prints peak RSS (KB) and per-turn CPU seconds as JSON.
CONTAINER = """
import json, resource, time
import handlers.api
from picoflow.aws.apigw import FakeLambdaContext, http_event
init_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu, session = [], None
for message in MESSAGES:
    headers = {"CHAT_SESSION_ID": session} if session else None
    event = http_event("POST", "/ai/run", body={"flowName": FLOW, "message": message}, headers=headers)
    before = time.process_time()
    result = handlers.api.lambda_handler(event, FakeLambdaContext())
    cpu.append(time.process_time() - before)
    assert result["statusCode"] == 200, result
    session = json.loads(result["body"])["session"]
assert json.loads(result["body"])["completed"] is True, result
print(json.dumps({"init_kb": init_kb, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "cpu": cpu}))
"""

CASES = {
    "primed at init (as deployed)": {"AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"},
    "not primed": {"PICOFLOW_PRIME": "false"},
}


def run(env: dict[str, str]) -> dict[str, object]:
    code = CONTAINER.replace("MESSAGES", repr([turn.user for turn in CONVERSATION])).replace(
        "FLOW", repr(OpenAICollectionFlow.id)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"function process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def turn_seconds(cpu_seconds: float, memory_mb: int) -> float:
    """Billed duration of a turn's CPU work at ``memory_mb``: slower in proportion below one full vCPU."""
    return cpu_seconds * max(1.0, FULL_VCPU_MB / memory_mb)


def cost_per_1000_turns(cpu_seconds: float, memory_mb: int, architecture: str) -> float:
    gb_seconds = memory_mb / 1024 * turn_seconds(cpu_seconds, memory_mb)
    return 1000 * (gb_seconds * PRICE_PER_GB_SECOND[architecture] + PRICE_PER_REQUEST)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tests.support.dynamodb_local import DUMMY_AWS_ENV, create_unique_table, local_client, running_dynamodb_local

    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_", "AWS_LAMBDA_", "PICOFLOW_"))}
    samples: dict[str, list[dict[str, object]]] = {name: [] for name in CASES}
    import httpx

    with ReplayServerProcess() as server, running_dynamodb_local() as endpoint, httpx.Client() as control:
        script = ServerScript(server.url, control)
        table = create_unique_table(local_client(endpoint), endpoint).name
        base.update(
            DUMMY_AWS_ENV, PICOFLOW_FLOWS="benchmarks.memory_flow", POWERTOOLS_METRICS_DISABLED="true",
            POWERTOOLS_LOG_LEVEL="WARNING", OPENAI_API_KEY="sk-bench-not-a-key", OPENAI_BASE_URL=f"{server.url}/v1",
            SESSION_STORE="DYNAMODB", SESSION_TABLE=table, DYNAMODB_ENDPOINT_URL=endpoint,
        )
        for _ in range(args.runs):  # interleaved, so machine noise hits every case alike
            for name, extra in CASES.items():
                script.reset()
                samples[name].append(run({**base, **extra}))
    body = report(samples, args.runs)
    print(body)
    write_section(TITLE, COMMAND, body)


def report(samples: dict[str, list[dict[str, object]]], runs: int) -> str:
    rows = ["| container | peak RSS after init MB | peak RSS after 20 turns MB | CPU ms per turn (mean of 20; "
            "first turn) | warm turn CPU ms (median) |", "|---|---:|---:|---:|---:|"]
    means: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for name, results in samples.items():
        init_mb = statistics.median(r["init_kb"] for r in results) / 1024
        peaks[name] = statistics.median(r["peak_kb"] for r in results) / 1024
        means[name] = statistics.median(statistics.mean(r["cpu"]) for r in results)
        first = statistics.median(r["cpu"][0] for r in results)
        warm = statistics.median(statistics.median(r["cpu"][1:]) for r in results)
        rows.append(f"| {name} | {init_mb:.0f} | {peaks[name]:.0f} | {means[name] * 1000:.1f}; {first * 1000:.1f} "
                    f"| {warm * 1000:.1f} |")
    deployed = next(iter(samples))
    cpu = means[deployed]
    cost_rows = [
        "| memory | vCPU share | billed ms per turn (CPU work) | arm64 $ per 1,000 turns | x86_64 $ per 1,000 turns "
        "| + per second of model wait per turn, arm64 $ per 1,000 turns |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for memory in MEMORY_SIZES:
        share = min(1.0, memory / FULL_VCPU_MB)
        wait = 1000 * memory / 1024 * PRICE_PER_GB_SECOND["arm64"]
        cost_rows.append(
            f"| {memory} MB | {share:.2f} | {turn_seconds(cpu, memory) * 1000:.1f} | "
            f"{cost_per_1000_turns(cpu, memory, 'arm64'):.5f} | {cost_per_1000_turns(cpu, memory, 'x86_64'):.5f} | "
            f"{wait:.5f} |"
        )
    peak = peaks[deployed]
    return "\n".join(rows) + "\n\n" + "\n".join(cost_rows) + (
        f"\n\nPeak RSS of the function process over the 20 turns, primed as deployed: {peak:.0f} MB (goal: at most "
        f"{GOAL_MB} MB, so a 256 MB function keeps headroom: {'met' if peak <= GOAL_MB else 'NOT met'}). Medians of "
        f"{runs} fresh processes per container, interleaved. Costs use the deployed container's mean CPU per turn "
        f"over the conversation ({cpu * 1000:.1f} ms, first turn included) and the model of the module docstring: "
        "below 1,769 MB the CPU work stretches as the vCPU share shrinks, so the GB-seconds of CPU work stay about "
        "the same from 256 to 1,024 MB, while every second spent waiting for the model costs in proportion to the "
        "memory (last column): the smallest size that holds the peak is the cheapest for LLM turns, at the price of "
        "slower CPU-bound work (the billed ms column). Request charge included ($0.0002 per 1,000)."
    )


if __name__ == "__main__":
    main()
