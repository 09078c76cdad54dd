"""Cold start: the handler's import plus its first turn, in fresh processes, next to the mandated imports.

Run: .venv/bin/python benchmarks/cold_start.py [--runs 10]

The floor is a fresh interpreter importing boto3, aws_lambda_powertools and langchain_openai, the dependencies
every deployment carries. The measured cold start is a fresh interpreter importing ``handlers.api`` and
serving one ``POST /ai/run`` on a scripted model with the in-memory store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402

FLOOR = """
import time
start = time.perf_counter()
import boto3, aws_lambda_powertools, langchain_openai
print(time.perf_counter() - start)
"""

COLD_START = """
import json, time
start = time.perf_counter()
from handlers.api import lambda_handler
from picoflow.aws.apigw import FakeLambdaContext, http_event
imported = time.perf_counter()
event = http_event("POST", "/ai/run", body=json.dumps({"flowName": "BasicFlow", "message": "Hi"}))
result = lambda_handler(event, FakeLambdaContext())
assert result["statusCode"] == 200, result
print(imported - start, time.perf_counter() - start)
"""


def run(code: str, env: dict[str, str]) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(json.dumps([{"content": "Hello! Which cities should I check?"}]), encoding="utf-8")
    env = {
        **os.environ,
        "SESSION_STORE": "MEMORY",
        "PICOFLOW_SCRIPT": str(script),
        "PICOFLOW_FLOWS": "flows.basic",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    floors, imports, totals = [], [], []
    for _ in range(args.runs):  # interleaved, so machine noise hits both sides alike
        floors.append(run(FLOOR, env)[0])
        imported, total = run(COLD_START, env)
        imports.append(imported)
        totals.append(total)
    floor, imported, total = (statistics.median(v) * 1000 for v in (floors, imports, totals))
    body = (
        "| measure | median ms |\n|---|---:|\n"
        f"| floor: import boto3 + aws_lambda_powertools + langchain_openai | {floor:.0f} |\n"
        f"| import handlers.api | {imported:.0f} |\n"
        f"| import handlers.api + first turn (scripted model, memory store) | {total:.0f} |\n\n"
        f"Cold start is {total / floor:.2f}x the floor (goal: at most 1.3x), medians of {args.runs} fresh "
        "processes each, interleaved. The OpenAI client is imported on first use, so a scripted turn never loads it."
    )
    print(body)
    write_section("Cold start (cold_start.py)", "python benchmarks/cold_start.py", body)


if __name__ == "__main__":
    main()
