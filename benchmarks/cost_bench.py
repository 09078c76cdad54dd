"""What a conversation costs: the all-in price of 1,000 turns of each bundled flow's reference conversation.

Run: .venv/bin/python benchmarks/cost_bench.py

Each conversation (``flows/<flow>/conversation.json``) runs through the real Lambda handler (API Gateway v2
events) on a DynamoDB table in moto, its model calls answered from the flow's script. Measured per turn:

* DynamoDB: every request the store's botocore client sends, and the size of each item written (``item_size``,
  as DynamoDB counts it); a write costs ceil(size / 1 KB) write request units, a strongly consistent read of an
  item ceil(size / 4 KB) read request units;
* Lambda: the CPU time of the invocation in this process, plus ``MODEL_SECONDS_PER_CALL`` of waiting for the
  model per model call, billed at the template's 512 MB on arm64; one request each;
* CloudWatch Logs: the bytes the invocation logged (JSON lines and metric documents) plus 26 bytes per event;
* API Gateway (one HTTP request per turn) and X-Ray (one trace per request);
* tokens: the same conversation through ``benchmarks/tokens_bench.py``'s fake endpoints under OpenAI's and
  Anthropic's caching rules (input, cache reads and writes, output), priced with and without the cache.

Prices come from ``benchmarks/prices.json`` (one file, with the date they were taken); the bench only multiplies.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from benchmarks.results import write_section  # noqa: E402
from benchmarks.tokens_bench import reference, run_picoflow  # noqa: E402
from picoflow.aws import runtime as aws_runtime  # noqa: E402
from picoflow.aws.apigw import FakeLambdaContext, http_event  # noqa: E402
from picoflow.session.dynamodb_store import item_size  # noqa: E402
from tests.support.dynamodb_local import DUMMY_AWS_ENV, REGION, create_unique_table  # noqa: E402

TITLE = "What a conversation costs: all-in price per 1,000 turns (cost_bench.py)"
COMMAND = ".venv/bin/python benchmarks/cost_bench.py"
ROOT = Path(__file__).resolve().parents[1]
PRICES = json.loads((Path(__file__).with_name("prices.json")).read_text(encoding="utf-8"))
FLOWS = ("basic", "hotel", "home_insurance", "support")
#: Seconds the function waits for the model per call: an assumption (a short reply of a fast model).
MODEL_SECONDS_PER_CALL = 1.5
MEMORY_GB = 512 / 1024
#: What CloudWatch Logs adds to each event's bytes when it counts ingestion.
LOG_EVENT_OVERHEAD = 26


@dataclass
class Measured:
    turns: int = 0
    model_calls: int = 0
    cpu_seconds: float = 0.0
    log_bytes: int = 0
    write_units: int = 0
    read_units: int = 0
    writes: int = 0
    reads: int = 0
    last_item_bytes: int = 0
    sizes: dict[str, int] = field(default_factory=dict)


def _watch(client: Any, measured: Measured) -> None:
    """Count the store's requests and their capacity units from what each request carries."""

    def before(params: dict[str, Any], model: Any, **_: Any) -> None:
        name = model.name
        if name == "PutItem":
            size = item_size(params["Item"])
            measured.writes += 1
            measured.write_units += max(1, math.ceil(size / 1024))
            measured.sizes[params["Item"]["id"]["S"]] = size
            if not params["Item"]["id"]["S"].startswith("effect#"):
                measured.last_item_bytes = size
        elif name == "GetItem":
            size = measured.sizes.get(params["Key"]["id"]["S"], 0)
            measured.reads += 1
            measured.read_units += max(1, math.ceil(size / 4096))
        elif name == "DeleteItem":
            measured.writes += 1
            measured.write_units += max(1, math.ceil(measured.sizes.get(params["Key"]["id"]["S"], 0) / 1024))

    client.meta.events.register("provide-client-params.dynamodb.*", before)


def run_flow(folder: str) -> Measured:
    data = json.loads((ROOT / "flows" / folder / "conversation.json").read_text(encoding="utf-8"))
    replies = [reply for turn in data["turns"] for reply in turn.get("replies", [])]
    measured = Measured(turns=len(data["turns"]), model_calls=len(replies))
    with tempfile.TemporaryDirectory() as scratch, mock_aws():
        script = Path(scratch) / "script.json"
        script.write_text(json.dumps(replies), encoding="utf-8")
        table = create_unique_table(boto3.client("dynamodb", region_name=REGION), None)
        os.environ.update({
            "SESSION_STORE": "DYNAMODB", "SESSION_TABLE": table.name, "PICOFLOW_FLOWS": f"flows.{folder}",
            "PICOFLOW_SCRIPT": str(script), "SESSION_TTL_SECONDS": "604800",
        })
        aws_runtime.reset_runtime()
        _watch(aws_runtime.get_engine().session_store.client, measured)
        session = None
        for turn in data["turns"]:
            body: dict[str, Any] = {"flowName": data["flow"], "message": turn["user"]}
            if session is None and data.get("config"):
                body["config"] = data["config"]
            headers = {"CHAT_SESSION_ID": session} if session else {}
            logged = io.StringIO()
            started = time.process_time()
            with contextlib.redirect_stdout(logged), _logs_to(logged):
                answer = aws_runtime_handler()(http_event("POST", "/ai/run", body=body, headers=headers),
                                               FakeLambdaContext())
            measured.cpu_seconds += time.process_time() - started
            lines = logged.getvalue().splitlines()
            measured.log_bytes += sum(len(line.encode("utf-8")) + LOG_EVENT_OVERHEAD for line in lines)
            if answer["statusCode"] != 200:
                raise RuntimeError(f"{folder}: {answer['statusCode']} {answer['body'][:200]}")
            # A step with another content type answers its raw body: the session is in the header.
            session = {k.lower(): v for k, v in answer["headers"].items()}["chat_session_id"]
        aws_runtime.reset_runtime()
    return measured


@contextlib.contextmanager
def _logs_to(stream: io.StringIO) -> Any:
    """Send the function's log lines (Powertools' handlers hold the stdout of their creation) to ``stream``."""
    handlers = [h for h in logging.getLogger("picoflow").handlers if isinstance(h, logging.StreamHandler)]
    previous = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            if old is not None:
                handler.setStream(old)


def aws_runtime_handler() -> Any:
    import handlers.api

    return handlers.api.lambda_handler


def token_costs(folder: str) -> dict[str, tuple[float, float, float]]:
    """Per provider: (cost with the cache, cost without, share of input read from the cache) of the conversation."""
    costs = {}
    for kind, prices in PRICES["tokens_per_million"].items():
        tally = asyncio.run(run_picoflow(reference(folder), kind))
        uncached = tally.input - tally.read - tally.write
        with_cache = (uncached * prices["input"] + tally.read * prices["cached_read"]
                      + tally.write * prices["cache_write"] + tally.output * prices["output"]) / 1e6
        without = (tally.input * prices["input"] + tally.output * prices["output"]) / 1e6
        costs[kind] = (with_cache, without, tally.read / tally.input if tally.input else 0.0)
    return costs


def per_thousand(m: Measured) -> dict[str, float]:
    """The infrastructure's dollars per 1,000 turns, by service."""
    scale = 1000 / m.turns
    lam, api, ddb = PRICES["lambda"], PRICES["api_gateway"], PRICES["dynamodb_on_demand"]
    billed_seconds = m.cpu_seconds + m.model_calls * MODEL_SECONDS_PER_CALL
    return {
        "Lambda": scale * (
            billed_seconds * MEMORY_GB * lam["arm64_gb_second"] + m.turns * lam["per_million_requests"] / 1e6
        ),
        "API Gateway": 1000 * api["http_per_million_requests"] / 1e6,
        "DynamoDB": scale * (m.write_units * ddb["per_million_write_request_units"]
                             + m.read_units * ddb["per_million_read_request_units"]) / 1e6,
        "CloudWatch Logs": scale * m.log_bytes / 1e9 * PRICES["cloudwatch"]["logs_ingestion_per_gb"],
        "X-Ray": 1000 * PRICES["xray"]["per_million_traces_recorded"] / 1e6,
    }


def main() -> None:
    os.environ.update(DUMMY_AWS_ENV)
    os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "picoflow")
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", "FILES_BUCKET", "FILES_FOLDER"):
        os.environ.pop(name, None)
    rows, token_rows = [], []
    for folder in FLOWS:
        measured = run_flow(folder)
        infra = per_thousand(measured)
        tokens = token_costs(folder)
        scale = 1000 / measured.turns
        infra_total = sum(infra.values())
        name = json.loads((ROOT / "flows" / folder / "conversation.json").read_text(encoding="utf-8"))["flow"]
        rows.append(
            f"| {name} | {measured.turns} | {measured.model_calls / measured.turns:.1f} "
            f"| {measured.last_item_bytes / 1024:.1f} KB | {measured.write_units / measured.turns:.1f} "
            f"| {measured.read_units / measured.turns:.1f} | "
            + " | ".join(f"${value:.4f}" for value in infra.values())
            + f" | **${infra_total:.4f}** |"
        )
        for kind, (with_cache, without, share) in tokens.items():
            model = PRICES["tokens_per_million"][kind]["model"]
            token_rows.append(
                f"| {name} | {kind} `{model}` | {share:.0%} | ${scale * without:.2f} | ${scale * with_cache:.2f} "
                f"| ${scale * with_cache + infra_total:.2f} |"
            )
    body = "\n".join([
        f"Prices from `benchmarks/prices.json`, dated {PRICES['date']} ({PRICES['note']})",
        f"Lambda at 512 MB arm64, billed for the measured CPU time plus {MODEL_SECONDS_PER_CALL} s of model wait "
        "per model call (an assumption); API Gateway HTTP API; DynamoDB on demand from the items the store wrote "
        "(the store's own botocore requests, sized as DynamoDB sizes items); CloudWatch Logs ingestion of the "
        "function's log lines and metric documents; one X-Ray trace per request. Storage (DynamoDB, PITR, logs) "
        "is billed per GB-month, not per turn, and is left out; so are files (none of these flows uploads one).",
        "",
        "Infrastructure, US dollars per 1,000 turns:",
        "",
        "| flow | turns | model calls per turn | item at the last turn | write units per turn | read units per turn "
        "| Lambda | API Gateway | DynamoDB | CloudWatch Logs | X-Ray | infrastructure |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Tokens, US dollars per 1,000 turns (the conversation's tokens under each provider's caching rules, "
        "`benchmarks/tokens_bench.py`), and the all-in total with the cache:",
        "",
        "| flow | provider | input read from cache | tokens, no cache | tokens, with cache | all-in, with cache |",
        "|---|---|---:|---:|---:|---:|",
        *token_rows,
    ])
    print(body)
    write_section(TITLE, COMMAND, body)


if __name__ == "__main__":
    main()
