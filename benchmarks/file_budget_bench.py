"""Request bytes and memory of a conversation that attaches a file on every turn.

Run: .venv/bin/python benchmarks/file_budget_bench.py [--baseline REV]

A one-step chat flow on ``gpt-4o-mini`` (``ChatOpenAI`` over HTTP to a loopback server that records each request
body) gets a new 180 KB PNG on each of four turns, the way ``POST /ai/run`` attaches an uploaded file (the
intake's check and read under a 200 KB per-turn cap, then the engine, files in a local folder); on a fifth turn
the user asks about the first page again and the model asks to see it (its tool call names the first file id
the request shows; code without ``open_file`` answers that call as an unknown tool). Each conversation runs in a
fresh process, which reports the peak of Python's traced allocations during each turn (``tracemalloc``) and its
peak resident set. With ``--baseline REV`` the same conversation also runs on the code of that git revision
(extracted with ``git archive``), for a before/after table.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import write_section  # noqa: E402
from tests.support.fake_openai import FakeOpenAIServer, chat_completion  # noqa: E402

TITLE = "Files in model requests over a conversation (file_budget_bench.py)"
COMMAND = ".venv/bin/python benchmarks/file_budget_bench.py --baseline 2171949"
FILE_BYTES = 180 * 1024
TURN_CAP = 200 * 1024
PAGES = 4
FILE_ID = re.compile(r"f_[A-Za-z0-9_-]{32}")

# One process: the conversation on the code in its working folder; prints what it measured as JSON.
CONVERSATION = """
import asyncio, json, resource, time, tracemalloc
import picoflow
from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.files.intake import take_files
from picoflow.files.local_store import LocalFileStore
from picoflow.files.policy import FilePolicy
from picoflow.files.refs import new_file_id
from picoflow.files.store import FileRecord
from picoflow.models.factory import default_registry
from picoflow.stores import MemorySessionStore

PNG = bytes.fromhex("89504e470d0a1a0a")

class PageStep(Step):
    def get_prompt(self):
        return "Read the pages the user sends and answer questions about them."

class PagesFlow(Flow):
    def config_model(self):
        return ModelSelection(provider="openai", name="gpt-4o-mini")
    def define_steps(self):
        return [PageStep(self).use_memory("pages")]

async def main():
    store = LocalFileStore(FOLDER)
    policy = FilePolicy(max_turn_bytes=TURN_CAP)
    engine = FlowEngine([PagesFlow], MemorySessionStore(), default_registry(), file_store=store)
    session, peaks = None, []
    messages = [f"Here is page {n + 1}." for n in range(PAGES)] + ["What did page 1 say again?"]
    tracemalloc.start()
    for n, message in enumerate(messages):
        files = []
        if n < PAGES:
            file_id = new_file_id()
            data = PNG + file_id.encode() * (FILE_BYTES // len(file_id))
            data = data[:FILE_BYTES]
            record = FileRecord(id=file_id, name=f"page-{n + 1}.png", content_type="image/png", size=len(data),
                                expires_at=int(time.time()) + 3600)
            await store.put(record, data)
            del data
            files = [file_id]
        # The turn: the intake's check and read of the file, then the engine (the upload is the client's).
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        taken = await take_files(store, policy, file_ids=files, caller=None, session_id=session)
        result = await engine.run("PagesFlow", message, session, files=taken.refs, file_data=taken.data)
        del taken
        assert result.success, result.message
        session = result.session
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
    print(json.dumps({"picoflow": picoflow.__file__, "peaks": peaks,
                      "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))

asyncio.run(main())
"""


def _replies() -> list[Any]:
    answers: list[Any] = [chat_completion(content=f"Page {n + 1} noted.") for n in range(PAGES)]

    def reopen(body: dict[str, Any]) -> dict[str, Any]:
        found = FILE_ID.search(json.dumps(body.get("messages")))
        file_id = found.group(0) if found else "f_" + "0" * 32
        return chat_completion(tool_calls=[{"id": "call_1", "name": "open_file", "args": {"file_id": file_id}}])

    return [*answers, reopen, chat_completion(content="Page 1 lists three items.")]


def _file_bytes(body: dict[str, Any]) -> int:
    """The decoded bytes of every file part (image or file data URL) in a Chat Completions request."""
    total = 0
    for message in body.get("messages") or []:
        for part in message.get("content") if isinstance(message.get("content"), list) else []:
            url = (part.get("image_url") or {}).get("url") or (part.get("file") or {}).get("file_data") or ""
            if url.startswith("data:"):
                total += len(base64.b64decode(url.split(",", 1)[1]))
    return total


def conversation(root: Path) -> dict[str, Any]:
    """Run the conversation on the code under ``root``; what the model server and the process measured."""
    with FakeOpenAIServer(_replies()) as server, tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "OPENAI_API_KEY": "bench-key", "OPENAI_BASE_URL": server.url + "/v1",
               "NO_PROXY": "127.0.0.1,localhost"}
        for name in ("PICOFLOW_SCRIPT", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env.pop(name, None)
        code = (CONVERSATION.replace("FOLDER", repr(folder)).replace("TURN_CAP", str(TURN_CAP))
                .replace("FILE_BYTES", str(FILE_BYTES)).replace("PAGES", str(PAGES)))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env,
                             check=False, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"conversation failed:\n{out.stderr[-3000:]}")
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        if not measured["picoflow"].startswith(str(root)):
            raise RuntimeError(f"ran {measured['picoflow']}, not the code under {root}")
        sizes, bodies = list(server.sizes), list(server.requests)
    # Turns 1-4 make one model call each; turn 5 two (the model's open_file call, then its answer).
    calls_per_turn = [1] * PAGES + [2]
    turns, start = [], 0
    for n, count in enumerate(calls_per_turn):
        turns.append({
            "request_bytes": sum(sizes[start:start + count]),
            "file_bytes": sum(_file_bytes(body) for body in bodies[start:start + count]),
            "calls": count,
            "peak_bytes": measured["peaks"][n],
        })
        start += count
    return {"turns": turns, "maxrss_kb": measured["maxrss_kb"]}


def extract(revision: str, target: Path) -> Path:
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def _kb(value: int) -> str:
    return f"{value / 1024:,.0f}"


def report(runs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "A one-step chat flow gets a new 180 KB PNG on each of turns 1-4 (200 KB per-turn cap); on turn 5 the user",
        "asks about page 1 again and the model calls `open_file` for it (2 model calls). Request bytes are the",
        "HTTP bodies `ChatOpenAI` sent to a loopback server (all model calls of the turn); file bytes are the",
        "decoded bytes of the image parts in them. Peak memory is the peak of Python's traced allocations",
        "(`tracemalloc`) during the turn (the intake's check and read, then the engine's turn), above what was",
        "allocated before it; peak RSS is the process's at the end of the conversation. About 4 MB of each",
        "before turn with a new file is the local store's read, which set aside its 5 MB limit before reading",
        "(now sized to the file); what remains grows with the files the request carries.",
        "",
        "| code | turn | model calls | request KB | file KB sent | peak memory in the turn KB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, run in runs.items():
        for n, turn in enumerate(run["turns"], start=1):
            lines.append(f"| {label} | {n} | {turn['calls']} | {_kb(turn['request_bytes'])} | "
                         f"{_kb(turn['file_bytes'])} | {_kb(turn['peak_bytes'])} |")
    lines.append("")
    for label, run in runs.items():
        total = sum(turn["request_bytes"] for turn in run["turns"])
        lines.append(f"- {label}: {_kb(total)} KB sent over the 5 turns; peak RSS {run['maxrss_kb'] / 1024:.0f} MB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to measure too (before)")
    args = parser.parse_args()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if args.baseline:
            runs[f"before ({args.baseline})"] = conversation(extract(args.baseline, Path(scratch)))
        runs["after (this code)"] = conversation(ROOT)
    body = report(runs)
    print(body)
    write_section(TITLE, COMMAND if args.baseline else COMMAND.split(" --")[0], body)


if __name__ == "__main__":
    main()
