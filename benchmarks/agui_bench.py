"""AG-UI streaming overhead: how soon an AG-UI client holds the model's first words through ``picoflow serve``.

The fake OpenAI-compatible model of ``stream_bench.py`` (first word 300 ms after the request, then one word every
50 ms, in a process of its own) answers every turn; ``picoflow serve`` runs the real Lambda handler module in a
subprocess. Each turn is ``POST /ag-ui/TinyFlow`` with a new thread; the time from the model writing its first
word to the client reading the first ``TEXT_MESSAGE_CONTENT`` frame is measured over ``--turns`` turns (same
machine, one monotonic clock). Run: ``.venv/bin/python benchmarks/agui_bench.py``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from benchmarks.stream_bench import (  # noqa: E402
    FLOW,
    GOAL_P95_MS,
    REPLY,
    WARM_UP_TURNS,
    Model,
    Serve,
    environment,
    percentile,
)


def agui_turn(server: Serve) -> tuple[float | None, list[str], str]:
    """One run on a new thread: when the first text arrived, the event types, and the text."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    body = {"threadId": str(uuid.uuid4()), "runId": uuid.uuid4().hex, "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": "u1", "role": "user", "content": "A room?"}]}
    try:
        connection.request("POST", f"/ag-ui/{FLOW}", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        first, types, text = None, [], ""
        for raw in response:
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            event: dict[str, Any] = json.loads(line[5:])
            types.append(event["type"])
            if event["type"] == "TEXT_MESSAGE_CONTENT":
                first = first if first is not None else time.monotonic()
                text += event["delta"]
        return first, types, text
    finally:
        connection.close()


def through_serve(turns: int) -> list[float]:
    arrived: list[float] = []
    with Model(turns + WARM_UP_TURNS) as model:
        server = Serve(environment(model))
        try:
            for _ in range(turns + WARM_UP_TURNS):
                first, types, text = agui_turn(server)
                assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
                assert text == REPLY and first is not None, text
                arrived.append(first)
        finally:
            server.close()
    pairs = list(zip(arrived, model.written, strict=True))[WARM_UP_TURNS:]
    return [(at - written) * 1000 for at, written in pairs]


def report(turns: int) -> str:
    gaps = through_serve(turns)
    p50, p95 = statistics.median(gaps), percentile(gaps, 0.95)
    verdict = "met" if p95 < GOAL_P95_MS else "missed"
    return f"""
A fake OpenAI-compatible model writes the first word of each reply 300 ms after the request, then one word every
50 ms ({len(REPLY.split())} words). Each turn is `POST /ag-ui/{FLOW}` on a new thread through `picoflow serve`
(the memory store). Overhead is the time from the model writing its first word to the client reading the first
`TEXT_MESSAGE_CONTENT` frame, over {turns} turns after {WARM_UP_TURNS} warm-up turns.

| transport | turns | first-text overhead p50 (ms) | p95 (ms) | max (ms) | goal p95 < {GOAL_P95_MS:.0f} ms |
|---|---:|---:|---:|---:|---|
| `picoflow serve`, AG-UI events | {len(gaps)} | {p50:.1f} | {p95:.1f} | {max(gaps):.1f} | {verdict} |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    args = parser.parse_args()
    body = report(args.turns)
    print(body)
    write_section("AG-UI: first-text overhead through picoflow serve (agui_bench.py)",
                  ".venv/bin/python benchmarks/agui_bench.py", body)


if __name__ == "__main__":
    main()
