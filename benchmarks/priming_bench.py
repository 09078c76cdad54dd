"""Init CPU and first-turn CPU with and without priming (picoflow.aws.priming), against a warm turn.

Run: .venv/bin/python benchmarks/priming_bench.py [--runs 7]

Each run is a fresh process that does what a Lambda container does: imports ``handlers.api`` (init), then serves
turns of ``benchmarks/cold_flow.py`` (one step, one tool, OpenAI's gpt-4o-mini) through the handler, as
``template.yaml`` deploys it: sessions in DynamoDB (DynamoDB Local), ``ChatOpenAI`` over HTTP on loopback
(``benchmarks/replay_openai.py`` in a process of its own, so its CPU is not counted). Three containers:

- not primed (``PICOFLOW_PRIME=false``): the first turn builds the engine, the clients and loads what it needs;
- primed at init (``AWS_LAMBDA_INITIALIZATION_TYPE=on-demand``): the handler's import runs ``prime``;
- SnapStart (``AWS_LAMBDA_INITIALIZATION_TYPE=snap-start``): the import registers the hooks, the process runs
  the before-snapshot hooks (init) and then the after-restore hooks (restore), as Lambda does around a snapshot.

CPU is ``time.process_time()`` (every thread of the process; the interpreter's own start-up is excluded). The
warm turn is the median of turns 4 to 11 of the same conversation in the same process. Medians over the runs,
interleaved. Goal: the first turn after priming at most 1.3x the CPU of a warm turn.
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

from benchmarks.cold_flow import GREETING  # noqa: E402
from benchmarks.replay_openai import ReplayServerProcess  # noqa: E402
from benchmarks.results import write_section  # noqa: E402

TITLE = "Priming: init and first-turn CPU against a warm turn (priming_bench.py)"
COMMAND = ".venv/bin/python benchmarks/priming_bench.py"
GOAL = 1.3
TURNS = 11
WARM = slice(3, TURNS)

# One container's life: init, (restore), then TURNS turns of one conversation; prints CPU seconds as JSON.
CONTAINER = """
import json, os, time
started = time.process_time()
import handlers.api
from picoflow.aws.apigw import FakeLambdaContext, http_event
restore = 0.0
if os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start":
    import snapshot_restore_py
    for func, args, kwargs in reversed(snapshot_restore_py.get_before_snapshot()):
        func(*args, **kwargs)
    snapshotted = time.process_time()
    for func, args, kwargs in snapshot_restore_py.get_after_restore():
        func(*args, **kwargs)
    restore = time.process_time() - snapshotted
    started += restore
init = time.process_time() - started
turns, session = [], None
for _ in range(TURNS):
    headers = {"CHAT_SESSION_ID": session} if session else None
    event = http_event("POST", "/ai/run", body={"flowName": "ColdStartFlow", "message": "Hi"}, headers=headers)
    before = time.process_time()
    result = handlers.api.lambda_handler(event, FakeLambdaContext())
    turns.append(time.process_time() - before)
    assert result["statusCode"] == 200, result
    body = json.loads(result["body"])
    assert body["message"] == REPLY, body
    session = body["session"]
print(json.dumps({"init": init, "restore": restore, "turns": turns}))
"""

CASES = {
    "not primed": {"PICOFLOW_PRIME": "false"},
    "primed at init": {"AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"},
    "SnapStart": {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"},
}


def run(env: dict[str, str]) -> dict[str, object]:
    code = CONTAINER.replace("TURNS", str(TURNS)).replace("REPLY", repr(GREETING))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"container process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from tests.support.dynamodb_local import DUMMY_AWS_ENV, create_unique_table, local_client, running_dynamodb_local

    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_", "AWS_LAMBDA_", "PICOFLOW_"))}
    samples: dict[str, list[dict[str, object]]] = {name: [] for name in CASES}
    with ReplayServerProcess("--reply", GREETING) as server, running_dynamodb_local() as endpoint:
        table = create_unique_table(local_client(endpoint), endpoint).name
        base.update(
            DUMMY_AWS_ENV, PICOFLOW_FLOWS="benchmarks.cold_flow", POWERTOOLS_METRICS_DISABLED="true",
            POWERTOOLS_LOG_LEVEL="WARNING", OPENAI_API_KEY="sk-bench-not-a-key", OPENAI_BASE_URL=f"{server.url}/v1",
            SESSION_STORE="DYNAMODB", SESSION_TABLE=table, DYNAMODB_ENDPOINT_URL=endpoint,
        )
        run({**base, **CASES["not primed"]})  # warm the server and the file system caches once
        for _ in range(args.runs):  # interleaved, so machine noise hits every case alike
            for name, extra in CASES.items():
                samples[name].append(run({**base, **extra}))
    body = report(samples, args.runs)
    print(body)
    write_section(TITLE, COMMAND, body)


def report(samples: dict[str, list[dict[str, object]]], runs: int) -> str:
    rows = ["| container | init CPU ms | restore CPU ms | first turn CPU ms | warm turn CPU ms | first / warm |",
            "|---|---:|---:|---:|---:|---:|"]
    ratios: dict[str, float] = {}
    for name, results in samples.items():
        init = statistics.median(r["init"] for r in results) * 1000
        restore = statistics.median(r["restore"] for r in results) * 1000
        first = statistics.median(r["turns"][0] for r in results) * 1000
        warm = statistics.median(statistics.median(r["turns"][WARM]) for r in results) * 1000
        ratios[name] = first / warm
        shown_restore = f"{restore:.0f}" if name == "SnapStart" else "—"
        rows.append(f"| {name} | {init:.0f} | {shown_restore} | {first:.1f} | {warm:.1f} | {ratios[name]:.2f}x |")
    primed = max(ratios["primed at init"], ratios["SnapStart"])
    return "\n".join(rows) + (
        f"\n\nAfter priming the first turn costs at most {primed:.2f}x the CPU of a warm turn (goal: at most {GOAL}x: "
        f"{'met' if primed <= GOAL else 'NOT met'}); without priming {ratios['not primed']:.2f}x. Medians of {runs} "
        "fresh processes per container, interleaved; the warm turn is each process's median of turns 4 to 11. A first "
        "turn writes once, like a warm turn (its conditional write creates the session). On SnapStart, init runs "
        "once per published version and each new container pays only the "
        "restore: the after-restore hook builds a new engine (new DynamoDB and OpenAI clients, credentials resolved "
        "anew) and reseeds `random`."
    )


if __name__ == "__main__":
    main()
