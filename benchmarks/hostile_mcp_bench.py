"""What a hostile MCP server costs a turn: peak memory, memory kept, model-request bytes and time.

Run: .venv/bin/python benchmarks/hostile_mcp_bench.py [--write]

Three hostile servers (``tests/support/hostile_mcp_server.py``), each over stdio and over streamable HTTP (a
process of its own): one tool with a 1 MB description, 5,000 tools, and a tool answering 110,000 hotels (about
20 MB). Each case is one turn in a fresh process on the memory store, with a chat model defined here that
answers from a script and measures each request it gets (the messages and tool descriptions as the OpenAI Chat
Completions body would carry them, JSON-encoded). The flow's step offers every tool of the server (``all_tools``);
the flood is called once by the model (an offered tool) and once by a handler (``call_mcp_tool``), after a warm-up
call of 10 hotels. Reported per case: the turn's outcome, the largest model request, peak RSS (``ru_maxrss``),
RSS after the turn (``VmRSS``, after a garbage collection) against RSS before it, and the turn's wall time under a
20-second turn deadline. ``--write`` records the figures in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402

from benchmarks.results import write_section  # noqa: E402
from picoflow import Flow, FlowEngine, ModelSelection, Step  # noqa: E402
from picoflow.mcp import MCPServerSpec, MCPTools  # noqa: E402
from picoflow.models.registry import ModelProvider, ProviderRegistry  # noqa: E402
from picoflow.stores import MemorySessionStore  # noqa: E402
from tests.support.hostile_flow import SearchStep  # noqa: E402
from tests.support.mcp_servers import HttpServer  # noqa: E402

TITLE = "Hostile MCP servers: memory and model-request bytes (hostile_mcp_bench.py)"
COMMAND = ".venv/bin/python benchmarks/hostile_mcp_bench.py --write"
FLOOD_HOTELS = 110_000
DEADLINE_SECONDS = 20.0
#: The same table measured before the caps (commit 83f137d: the SDK's own transports, every listed tool offered).
BEFORE = """
| Case | Transport | Turn | Largest model request | Peak RSS | RSS before -> after the turn | Turn time |
| --- | --- | --- | ---: | ---: | --- | ---: |
| 1 MB description | stdio | 200 | 977.7 KB | 105 MB | 103 -> 104 MB | 0.01 s |
| 1 MB description | http | 200 | 977.7 KB | 106 MB | 101 -> 102 MB | 0.01 s |
| 5,000 tools | stdio | 200 | 877.9 KB | 125 MB | 122 -> 116 MB | 0.04 s |
| 5,000 tools | http | 200 | 877.9 KB | 127 MB | 124 -> 119 MB | 0.16 s |
| 20 MB result, offered | stdio | 200 | 3.5 KB | 153 MB | 100 -> 101 MB | 12.78 s |
| 20 MB result, offered | http | 504 TURN_DEADLINE | 3.1 KB | 680 MB | 103 -> 391 MB | 26.65 s |
| 20 MB result, handler | stdio | 200 | 0.9 KB | 136 MB | 100 -> 119 MB | 11.15 s |
| 20 MB result, handler | http | 504 TURN_DEADLINE | 0.6 KB | 680 MB | 103 -> 390 MB | 28.98 s |
"""
CASES: dict[str, dict[str, str]] = {
    "1 MB description": {"HOSTILE_DESCRIPTION_BYTES": "1000000"},
    "5,000 tools": {"HOSTILE_TOOLS": "5000"},
    "20 MB result, offered": {},
    "20 MB result, handler": {},
}


class MeasuringModel(BaseChatModel):
    """Answers from ``replies`` in order and records the size of each request's messages and tools."""

    replies: list[dict[str, Any]]
    sizes: list[int]
    bound: list[dict[str, Any]] = []

    @property
    def _llm_type(self) -> str:
        return "measuring"

    def bind_tools(self, tools: Any, **kwargs: Any) -> MeasuringModel:
        return self.model_copy(update={"bound": [convert_to_openai_tool(t) for t in tools]})

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        body = {"messages": convert_to_openai_messages(messages), "tools": self.bound}
        self.sizes.append(len(json.dumps(body, ensure_ascii=False).encode()))
        reply = self.replies.pop(0)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(reply.get("content", ""),
                                                                         tool_calls=reply.get("tool_calls", [])))])


class MeasuringProvider(ModelProvider):
    name = "measuring"

    def __init__(self, model: MeasuringModel) -> None:
        self.model = model

    def chat_model(self, selection: ModelSelection) -> BaseChatModel:
        return self.model


class OfferStep(Step):
    def get_prompt(self) -> str:
        return "Use the tools."

    def use_mcp_tools(self) -> list[MCPTools]:
        return [MCPTools(server="hostile", all_tools=True)]


class HostileFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="measuring", name="m")

    def define_mcp_servers(self) -> list[MCPServerSpec]:
        url = os.environ.get("BENCH_MCP_URL")
        if url:
            return [MCPServerSpec.http("hostile", url)]
        return [MCPServerSpec.stdio("hostile", sys.executable, ["-m", "tests.support.hostile_mcp_server"],
                                    env={"PYTHONPATH": str(ROOT), **_hostile_env()}, cwd=str(ROOT))]

    def define_steps(self) -> list[Step]:
        return [OfferStep(self), SearchStep(self)]

    def initial_step(self) -> Any:
        return self.get_context("config.start")


def _hostile_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith("HOSTILE_")}


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "args": args, "id": call_id}]}


async def one_case(case: str) -> dict[str, Any]:
    """Run ``case`` in this process (a fresh one) and return its figures."""
    offered = case != "20 MB result, handler"
    start = "OfferStep" if offered else "SearchStep"
    if case.startswith("20 MB"):
        name, warm_args, big_args = ("flood" if offered else "search"), {"hotels": 10}, {"hotels": FLOOD_HOTELS}
        replies = [call(name, warm_args, "w"), {"content": "ok"}, call(name, big_args, "b"), {"content": "done"}]
        messages = ["warm up", "search"]
    else:
        replies = [{"content": "Hello"}, {"content": "Hello again"}]
        messages = ["Hi", "Hi again"]
    model = MeasuringModel(replies=replies, sizes=[])
    # The model's own list (validation copies the one passed in), shared by its tool-bound copies.
    sizes = model.sizes
    engine = FlowEngine(flows=[HostileFlow], session_store=MemorySessionStore(),
                        providers=ProviderRegistry(override=MeasuringProvider(model)))
    config = {"start": start}
    first = await engine.run("HostileFlow", messages[0], config=config,
                             deadline=time.monotonic() + DEADLINE_SECONDS * 4)
    gc.collect()
    before_kb, sizes_before = rss_kb(), len(sizes)
    started = time.monotonic()
    second = await engine.run("HostileFlow", messages[1], first.session, config=config,
                              deadline=time.monotonic() + DEADLINE_SECONDS)
    elapsed = time.monotonic() - started
    await engine.close()
    gc.collect()
    return {
        "outcome": "200" if second.success else f"{second.status_code} {second.error_code}",
        "request_kb": max(sizes[sizes_before:], default=0) / 1024,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "before_mb": before_kb / 1024,
        "after_mb": rss_kb() / 1024,
        "seconds": elapsed,
    }


def run_case(case: str, transport: str) -> dict[str, Any]:
    env = {**os.environ, **CASES[case]}
    server = None
    if transport == "http":
        log = Path(tempfile.mkdtemp()) / "server.log"
        server = HttpServer("tests.support.hostile_mcp_server", log, env=CASES[case]).start()
        env["BENCH_MCP_URL"] = server.url
    try:
        done = subprocess.run([sys.executable, __file__, "--case", case], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
    finally:
        if server is not None:
            server.stop()
    if done.returncode != 0:
        raise RuntimeError(f"{case} over {transport} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


NOTES = """\
The 1 MB description and the 5,000 tools no longer reach the model (the tool is left out; the list is refused and
the step runs with the flow's own tools). The 20 MB answer is refused while it arrives (the model reads the fixed
unavailable sentence; the handler catches `MCPUnavailableError` with reason `too_large`): peak memory stays within a
few MB of the process's baseline instead of 150-680 MB, nothing is kept after the turn, and the turn ends within
its deadline (what remains of its time is the server building its 20 MB answer before the first byte arrives).
"""


def table() -> str:
    rows = [
        "| Case | Transport | Turn | Largest model request | Peak RSS | RSS before -> after the turn | Turn time |",
        "| --- | --- | --- | ---: | ---: | --- | ---: |",
    ]
    for case in CASES:
        for transport in ("stdio", "http"):
            r = run_case(case, transport)
            rows.append(
                f"| {case} | {transport} | {r['outcome']} | {r['request_kb']:,.1f} KB | {r['peak_mb']:.0f} MB | "
                f"{r['before_mb']:.0f} -> {r['after_mb']:.0f} MB | {r['seconds']:.2f} s |"
            )
            print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="record the figures in benchmarks/RESULTS.md")
    options = parser.parse_args()
    if options.case:
        import asyncio

        print(json.dumps(asyncio.run(one_case(options.case))))
        return
    figures = table()
    if options.write:
        caps = "With the default caps (1 MiB per message, 128 tools, 8 KiB per tool description)"
        write_section(TITLE, COMMAND, f"Before the caps:\n{BEFORE}\n{caps}:\n\n{figures}\n\n{NOTES}")


if __name__ == "__main__":
    main()
