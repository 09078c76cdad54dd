"""Stored session size as a conversation grows, with and without memory compaction.

Run: .venv/bin/python benchmarks/growth_bench.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import write_section  # noqa: E402
from picoflow import (  # noqa: E402
    Flow,
    FlowEngine,
    ModelSelection,
    Step,
    ToolSpec,
    stay,
    tool,
)
from picoflow.models.registry import ProviderRegistry  # noqa: E402
from picoflow.models.scripted import ScriptedProvider  # noqa: E402
from picoflow.stores import DynamoDBSessionStore, MemorySessionStore  # noqa: E402

CHECKPOINTS = (10, 50, 100, 200)
SENTENCE = "The guest asked about late check-out, parking near the lobby and a quiet room facing the park. "


class NoteArgs(BaseModel):
    note: str


class ConciergeStep(Step):
    def get_prompt(self) -> str:
        return "You are a hotel concierge. Record each request with the note tool, then answer."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="note", description="Record a guest request", schema=NoteArgs)]

    @tool
    async def note(self, args: dict) -> object:
        self.save_state({"last_note": args["note"][:80]})
        return stay("noted")


class PlainFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="bench")

    def define_steps(self) -> list[Step]:
        return [ConciergeStep(self).use_memory("concierge")]


class CompactedFlow(PlainFlow):
    def __init__(self) -> None:
        super().__init__()
        self.get_memory().set_summary_model(ModelSelection(provider="scripted", name="summary")).enable_summary(
            "concierge"
        )


def script(turns: int) -> list[dict]:
    """Two model calls per turn (a tool call, then an answer) and enough summaries for any compaction."""
    replies: list[dict] = []
    for i in range(turns):
        replies.append({"content": "", "tool_calls": [{"name": "note", "args": {"note": f"{SENTENCE} #{i}"}}]})
        replies.append({"content": f"Certainly. {SENTENCE * 2}(reply {i})"})
    return replies


class SummaryAwareProvider(ScriptedProvider):
    """Answers summary requests with a bounded summary and everything else from the script."""

    def chat_model(self, selection: ModelSelection):  # noqa: ANN201 - same type as the base
        if selection.name == "summary":
            return ScriptedProvider([{"for": "summary", "content": SENTENCE * 4}] * 1000).chat_model(selection)
        return super().chat_model(selection)


async def grow(flow_cls: type[Flow], turns: int) -> dict[int, tuple[int, int]]:
    provider = SummaryAwareProvider(script(turns))
    engine = FlowEngine(
        flows=[flow_cls], session_store=MemorySessionStore(), providers=ProviderRegistry(override=provider),
        retry_delay=0,
    )
    sizer = DynamoDBSessionStore("sizing-only")
    sizes: dict[int, tuple[int, int]] = {}
    session = None
    for turn in range(1, turns + 1):
        response = await engine.run(flow_cls.id, f"Request {turn}: {SENTENCE}", session)
        if not response.success:
            raise SystemExit(f"turn {turn} failed: {response.message}")
        session = response.session
        if turn in CHECKPOINTS:
            doc = await engine.session_store.load(session)
            sizes[turn] = (len(doc.model_dump_json(by_alias=True)), sizer.stored_size(doc))
    return sizes


async def main() -> None:
    turns = max(CHECKPOINTS)
    plain = await grow(PlainFlow, turns)
    compacted = await grow(CompactedFlow, turns)
    rows = ["| turns | JSON bytes, no compaction | item bytes, no compaction | JSON bytes, compaction | "
            "item bytes, compaction |", "|---:|---:|---:|---:|---:|"]
    for turn in CHECKPOINTS:
        rows.append(f"| {turn} | {plain[turn][0]:,} | {plain[turn][1]:,} | {compacted[turn][0]:,} | "
                    f"{compacted[turn][1]:,} |")
    ratio = compacted[200][0] / compacted[50][0]
    body = "\n".join(rows) + (
        f"\n\nWith compaction (16/8) the JSON document after 200 turns is {ratio:.2f}x its size after 50 turns "
        f"(goal: at most 1.5x); without it the document grows {plain[200][0] / plain[50][0]:.2f}x. "
        "Item bytes are the DynamoDB item size with the document stored compressed."
    )
    print(body)
    write_section("Session growth (growth_bench.py)", "python benchmarks/growth_bench.py", body)


if __name__ == "__main__":
    asyncio.run(main())
