"""Cold start on the real path: the handler's import plus its first turn over HTTP, in fresh processes.

Run: .venv/bin/python benchmarks/cold_start.py [--runs 10]

The floor is a fresh interpreter importing boto3, aws_lambda_powertools and langchain_openai, the
dependencies every deployment carries. The measured cold start is a fresh interpreter importing
``handlers.api`` and serving one ``POST /ai/run`` of ``benchmarks/cold_flow.py`` (one step, one tool) with
the OpenAI provider as a deployment runs it: ``ChatOpenAI`` built on the first turn and called over HTTP on
loopback (``benchmarks/replay_openai.py`` in a process of its own, so its CPU and start-up are not counted).
Times are wall clock inside each process, from before the first import to the response (interpreter
start-up excluded on both sides). Further rows show where the time goes: the X-Ray tracer a traced deployment
creates inside Lambda (the handler imports the SDK only there, and only with tracing on), the handler's import
alone, the same first turn with sessions in DynamoDB Local, and the earlier offline measurement (scripted
model).
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

from benchmarks.cold_flow import GREETING  # noqa: E402
from benchmarks.replay_openai import ReplayServerProcess  # noqa: E402
from benchmarks.results import write_section  # noqa: E402

GOAL = 1.1
FLOW = "ColdStartFlow"

FLOOR = """
import time
start = time.perf_counter()
import boto3, aws_lambda_powertools, langchain_openai
print(time.perf_counter() - start)
"""

FLOOR_TRACER = """
import time
start = time.perf_counter()
import boto3, aws_lambda_powertools, langchain_openai
from aws_lambda_powertools import Tracer
Tracer()
print(time.perf_counter() - start)
"""

# What any framework's first turn on this client needs: the floor, then ChatOpenAI built and called once.
FLOOR_CLIENT = """
import asyncio, time
start = time.perf_counter()
import boto3, aws_lambda_powertools, langchain_openai
model = langchain_openai.ChatOpenAI(model="gpt-4o-mini", api_key=KEY, base_url=URL, max_retries=0, timeout=60,
                                    temperature=0.2)
reply = asyncio.new_event_loop().run_until_complete(model.ainvoke([("system", "prompt"), ("human", "Hi")]))
assert reply.content == REPLY, reply
print(time.perf_counter() - start)
"""

# Added to FLOOR_CLIENT for sessions in DynamoDB: a boto3 client and a first turn's two writes (create, save).
DYNAMODB_WRITES = """dynamodb = boto3.client("dynamodb", endpoint_url=ENDPOINT)
for revision in (0, 1):
    dynamodb.put_item(TableName=TABLE, Item={"id": {"S": "floor-" + str(start)}, "revision": {"N": str(revision)},
                                            "doc": {"B": bytes(600)}})
"""

IMPORT_ONLY = """
import time
start = time.perf_counter()
import handlers.api
print(time.perf_counter() - start)
"""

FIRST_TURN = """
import json, time
start = time.perf_counter()
from handlers.api import lambda_handler
from picoflow.aws.apigw import FakeLambdaContext, http_event
imported = time.perf_counter()
event = http_event("POST", "/ai/run", body=json.dumps({"flowName": FLOW, "message": "Hi"}))
result = lambda_handler(event, FakeLambdaContext())
assert result["statusCode"] == 200, result
assert json.loads(result["body"])["message"] == REPLY, result
print(imported - start, time.perf_counter() - start)
"""


def run(code: str, env: dict[str, str]) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"cold-start process failed:\n{out.stderr[-2000:]}")
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    from tests.support.dynamodb_local import DUMMY_AWS_ENV, create_unique_table, local_client, running_dynamodb_local

    script = Path(tempfile.mkdtemp()) / "script.json"
    script.write_text(json.dumps([{"content": GREETING}]), encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_"))}
    base.update(
        DUMMY_AWS_ENV,
        PICOFLOW_FLOWS="benchmarks.cold_flow",
        POWERTOOLS_METRICS_DISABLED="true",
        POWERTOOLS_LOG_LEVEL="WARNING",
    )
    first_turn = FIRST_TURN.replace("FLOW", repr(FLOW)).replace("REPLY", repr(GREETING))
    samples: dict[str, list[list[float]]] = {}
    with ReplayServerProcess("--reply", GREETING) as server, running_dynamodb_local() as endpoint:
        table = create_unique_table(local_client(endpoint), endpoint).name
        wire = {**base, "OPENAI_API_KEY": "sk-bench-not-a-key", "OPENAI_BASE_URL": f"{server.url}/v1"}
        floor_client = (
            FLOOR_CLIENT.replace("KEY", repr(wire["OPENAI_API_KEY"])).replace("URL", repr(wire["OPENAI_BASE_URL"]))
            .replace("REPLY", repr(GREETING))
        )
        writes = DYNAMODB_WRITES.replace("ENDPOINT", repr(endpoint)).replace("TABLE", repr(table))
        floor_dynamodb = floor_client.replace("print(", writes + "print(", 1)
        # As template.yaml deploys the function: X-Ray tracing active, so Powertools' Tracer patches botocore and
        # the invocation carries a sampled trace header (segments go to a loopback port nobody reads).
        traced = {"AWS_LAMBDA_FUNCTION_NAME": "picoflow-api", "LAMBDA_TASK_ROOT": str(ROOT),
                  "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
                  "_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"}
        imports = "import boto3, aws_lambda_powertools, langchain_openai\n"
        floor_deployed = floor_dynamodb.replace(imports, imports + "aws_lambda_powertools.Tracer()\n", 1)
        cases = {
            "floor": (FLOOR, base),
            "floor_client": (floor_client, base),
            "floor_dynamodb": (floor_dynamodb, base),
            "floor_tracer": (FLOOR_TRACER, base),
            "import": (IMPORT_ONLY, {**wire, "SESSION_STORE": "MEMORY"}),
            "wire": (first_turn, {**wire, "SESSION_STORE": "MEMORY"}),
            "wire_dynamodb": (first_turn, {**wire, "SESSION_STORE": "DYNAMODB", "SESSION_TABLE": table,
                                            "DYNAMODB_ENDPOINT_URL": endpoint}),
            "floor_deployed": (floor_deployed, {**base, **traced}),
            "deployed": (first_turn, {**wire, **traced, "SESSION_STORE": "DYNAMODB", "SESSION_TABLE": table,
                                      "DYNAMODB_ENDPOINT_URL": endpoint}),
            "scripted": (first_turn, {**base, "SESSION_STORE": "MEMORY", "PICOFLOW_SCRIPT": str(script)}),
        }
        run(first_turn, cases["wire"][1])  # warm the server and the file system caches once
        for _ in range(args.runs):  # interleaved, so machine noise hits every case alike
            for name, (code, env) in cases.items():
                samples.setdefault(name, []).append(run(code, env))
    ms = {name: statistics.median(values[-1] for values in runs) * 1000 for name, runs in samples.items()}
    imported = statistics.median(values[0] for values in samples["wire"]) * 1000
    ratio = ms["wire"] / ms["floor"]
    body = (
        "| measure | median ms |\n|---|---:|\n"
        f"| floor: import boto3 + aws_lambda_powertools + langchain_openai | {ms['floor']:.0f} |\n"
        f"| floor + building `ChatOpenAI` and one request with it, no framework | {ms['floor_client']:.0f} |\n"
        f"| floor + that request + a boto3 DynamoDB client and a first turn's two PutItem requests, no framework "
        f"| {ms['floor_dynamodb']:.0f} |\n"
        f"| floor + the X-Ray `Tracer()` a traced deployment creates inside Lambda | {ms['floor_tracer']:.0f} |\n"
        f"| import handlers.api | {ms['import']:.0f} |\n"
        f"| **import handlers.api + first turn, OpenAI provider over HTTP, memory store** | {ms['wire']:.0f} |\n"
        f"| of which the handler's import (same processes) | {imported:.0f} |\n"
        f"| import handlers.api + first turn, OpenAI over HTTP, DynamoDB store (DynamoDB Local) "
        f"| {ms['wire_dynamodb']:.0f} |\n"
        f"| floor + that request + the DynamoDB requests + the X-Ray `Tracer()`, traced as deployed "
        f"| {ms['floor_deployed']:.0f} |\n"
        f"| **as deployed: import handlers.api + first turn, OpenAI over HTTP, DynamoDB store, X-Ray tracing on** "
        f"| {ms['deployed']:.0f} |\n"
        f"| import handlers.api + first turn, scripted model, memory store (offline) | {ms['scripted']:.0f} |\n\n"
        f"As `template.yaml` deploys it (X-Ray tracing active, sessions in DynamoDB) the cold start is "
        f"{ms['deployed'] / ms['floor_deployed']:.2f}x the same work done without the framework. "
        f"Cold start on the real path is {ratio:.2f}x the floor (goal: at most {GOAL}: "
        f"{'met' if ratio <= GOAL else 'NOT met'}); {ms['wire'] / ms['floor_client']:.2f}x the floor plus the "
        f"client's own first call, and with "
        f"sessions in DynamoDB Local {ms['wire_dynamodb'] / ms['floor']:.2f}x the floor "
        f"({ms['wire_dynamodb'] / ms['floor_dynamodb']:.2f}x the floor plus the client's call and the two "
        "DynamoDB requests made without the framework). Medians "
        f"of {args.runs} fresh processes per row, interleaved. The first turn builds `ChatOpenAI` (importing "
        "langchain-openai, which the floor imports too, and creating the OpenAI clients) and makes one chat "
        "completion request; the DynamoDB row adds the boto3 client and the session's create and save requests."
    )
    print(body)
    write_section("Cold start (cold_start.py)", ".venv/bin/python benchmarks/cold_start.py", body)


if __name__ == "__main__":
    main()
