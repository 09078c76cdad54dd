"""What users pay: input tokens, bytes sent, prompt-cache reads and the cost of whole conversations.

Run: .venv/bin/python benchmarks/tokens_bench.py

The reference conversations of the three bundled flows (``flows/*/conversation.json``) and a 200-turn profile
collection (``benchmarks/collection.py`` with 180 more questions asked in its first stage) run through the
engine on the real provider clients (``ChatOpenAI``, ``ChatAnthropic``, ``ChatBedrockConverse``), answered by
fake endpoints that replay the scripted replies and report usage under each provider's caching rules
(``tests/support/prompt_cache.py``: OpenAI automatic from 1,024 tokens in 128-token steps; Anthropic and
Bedrock up to the request's cache points, 1,024-token minimum of Claude Sonnet 4.5, 5-minute lifetime). A
simulated clock advances ``SECONDS_PER_TURN`` between turns. The 200-turn conversation also runs on the
LangGraph graph of ``benchmarks/collection_langgraph.py`` with the plain LangChain clients, the way a graph
calls them unless its author adds cache points.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.collection import CONVERSATION, ProfileCollectionFlow, Turn  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from picoflow import Flow, FlowEngine, ModelSelection  # noqa: E402
from picoflow.models.anthropic import AnthropicProvider  # noqa: E402
from picoflow.models.bedrock import BedrockProvider  # noqa: E402
from picoflow.models.openai import OpenAIProvider  # noqa: E402
from picoflow.models.registry import ModelProvider, ProviderRegistry  # noqa: E402
from picoflow.stores import MemorySessionStore  # noqa: E402
from tests.support.fake_anthropic import FakeAnthropicServer, anthropic_message  # noqa: E402
from tests.support.fake_bedrock import FakeBedrock, converse_response  # noqa: E402
from tests.support.fake_openai import FakeOpenAIServer, chat_completion  # noqa: E402
from tests.support.prompt_cache import BlockPrefixCache, OpenAIPrefixCache  # noqa: E402

TITLE = "What users pay: input tokens, prompt caching and cost per conversation (tokens_bench.py)"
COMMAND = ".venv/bin/python benchmarks/tokens_bench.py"
ROOT = Path(__file__).resolve().parents[1]
SECONDS_PER_TURN = 20.0
LONG_TURNS = 200
GOAL = 0.70
FILLER = Turn("Why do you need it?", ({"content": "Your full name goes on your profile. What is it?"},))


@dataclass(frozen=True)
class Prices:
    """US dollars per million tokens: input, cached input read, cache write, output."""

    model: str
    input: float
    read: float
    write: float
    output: float


# List prices assumed from the providers' public pricing pages as of October 2025 (Bedrock: on-demand, us-east-1).
PRICES = {
    "openai": Prices("gpt-4o", 2.50, 1.25, 2.50, 10.00),
    "anthropic": Prices("claude-sonnet-4-5", 3.00, 0.30, 3.75, 15.00),
    "bedrock": Prices("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 3.00, 0.30, 3.75, 15.00),
}


@dataclass
class Tally:
    turns: int = 0
    calls: int = 0
    bytes_sent: int = 0
    input: int = 0
    read: int = 0
    write: int = 0
    output: int = 0

    def cost(self, prices: Prices, cached: bool = True) -> float:
        if not cached:
            return (self.input * prices.input + self.output * prices.output) / 1e6
        uncached = self.input - self.read - self.write
        return (uncached * prices.input + self.read * prices.read + self.write * prices.write
                + self.output * prices.output) / 1e6


@dataclass
class Conversation:
    name: str
    flow: type[Flow]
    turns: list[str]
    replies: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)


def reference(folder: str) -> Conversation:
    data = json.loads((ROOT / "flows" / folder / "conversation.json").read_text(encoding="utf-8"))
    flow = getattr(importlib.import_module(f"flows.{folder}"), data["flow"])
    replies = [reply for turn in data["turns"] for reply in turn.get("replies", [])]
    return Conversation(data["flow"], flow, [turn["user"] for turn in data["turns"]], replies, data.get("config", {}))


def long_collection() -> Conversation:
    turns = list(CONVERSATION)
    turns[2:2] = [FILLER] * (LONG_TURNS - len(turns))
    replies = [reply for turn in turns for reply in turn.replies]
    return Conversation(f"Profile collection, {LONG_TURNS} turns", ProfileCollectionFlow, [t.user for t in turns],
                        replies)


def _calls(replies: list[dict[str, Any]]) -> list[tuple[Any, list[dict[str, Any]]]]:
    return [
        (reply.get("content") or None,
         [{"id": call.get("id") or f"call_{n}_{i}", "name": call["name"], "args": call["args"]}
          for i, call in enumerate(reply.get("tool_calls") or [])])
        for n, reply in enumerate(replies, 1)
    ]


def _forced_tool(body: dict[str, Any]) -> str | None:
    """The tool a structured-output request forces, in any of the three APIs' shapes."""
    choice = body.get("tool_choice") or (body.get("toolConfig") or {}).get("toolChoice") or {}
    choice = choice.get("function") or choice.get("tool") or choice
    return choice.get("name") if isinstance(choice, dict) else None


def _answers(build: Callable[..., dict[str, Any]], replies: list[dict[str, Any]]) -> list[Any]:
    """Reply bodies; a structured reply (a dict) is the forced tool's call, or JSON text without one."""

    def structured(content: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def answer(body: dict[str, Any]) -> dict[str, Any]:
            name = _forced_tool(body)
            if name is None:
                return build(content=json.dumps(content), tool_calls=[])
            return build(content=None, tool_calls=[{"id": "call_structured", "name": name, "args": content}])

        return answer

    return [structured(c) if isinstance(c, dict) else build(content=c, tool_calls=t) for c, t in _calls(replies)]


class Substitute(ModelProvider):
    """Serves every selection from ``inner`` with the benchmark's model and caching setting."""

    def __init__(self, inner: ModelProvider, model: str, params: dict[str, Any],
                 attach: Callable[[Any], Any] = lambda model: model) -> None:
        self.name, self.inner, self.model, self.params, self.attach = inner.name, inner, model, params, attach
        self.file_types = inner.file_types

    def chat_model(self, selection: ModelSelection) -> Any:
        chosen = ModelSelection(provider=self.inner.name, name=self.model, params=self.params)
        return self.attach(self.inner.chat_model(chosen))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Endpoint:
    """A fake provider endpoint, the PicoFlow provider and the plain LangChain model that call it."""

    fake: Any
    provider: ModelProvider
    langchain: Callable[[], Any]


def endpoint(kind: str, replies: list[dict[str, Any]], clock: Clock, prompt_cache: bool = True) -> Endpoint:
    model = PRICES[kind].model
    params = {} if prompt_cache or kind == "openai" else {"prompt_cache": False}
    if kind == "openai":
        fake: Any = FakeOpenAIServer(_answers(chat_completion, replies),
                                     cache=OpenAIPrefixCache(clock))
        inner: ModelProvider = OpenAIProvider(api_key="bench", base_url=f"{fake.url}/v1")
        from langchain_openai import ChatOpenAI

        return Endpoint(fake, Substitute(inner, model, params),
                        lambda: ChatOpenAI(model=model, api_key="bench", base_url=f"{fake.url}/v1"))
    if kind == "anthropic":
        fake = FakeAnthropicServer(_answers(anthropic_message, replies),
                                   cache=BlockPrefixCache(clock))
        inner = AnthropicProvider(api_key="bench", base_url=fake.url)
        from langchain_anthropic import ChatAnthropic

        return Endpoint(fake, Substitute(inner, model, params),
                        lambda: ChatAnthropic(model=model, api_key="bench", base_url=fake.url))
    fake = FakeBedrock(_answers(converse_response, replies), cache=BlockPrefixCache(clock))
    inner = BedrockProvider(region="us-east-1")
    from langchain_aws import ChatBedrockConverse

    return Endpoint(fake, Substitute(inner, model, params, fake.attach),
                    lambda: fake.attach(ChatBedrockConverse(model=model, region_name="us-east-1")))


def tally(fake: Any, turns: int) -> Tally:
    result = Tally(turns=turns, calls=len(fake.requests), bytes_sent=sum(fake.sizes))
    for usage in fake.usages:
        read = usage.get("cache_read_input_tokens", usage.get("cacheReadInputTokens",
                         (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
        write = usage.get("cache_creation_input_tokens", usage.get("cacheWriteInputTokens", 0))
        if "prompt_tokens" in usage:
            total = usage["prompt_tokens"]
        elif "inputTokens" in usage:
            total = usage["inputTokens"] + read + write
        else:
            total = usage["input_tokens"] + read + write
        result.input += total
        result.read += read
        result.write += write
        result.output += usage.get("output_tokens", usage.get("outputTokens", usage.get("completion_tokens", 0)))
    return result


async def run_picoflow(conversation: Conversation, kind: str, prompt_cache: bool = True) -> Tally:
    clock = Clock()
    point = endpoint(kind, conversation.replies, clock, prompt_cache)
    with _serving(point.fake):
        engine = FlowEngine(flows=[conversation.flow], session_store=MemorySessionStore(),
                            providers=ProviderRegistry(override=point.provider), retry_delay=0)
        session = None
        for text in conversation.turns:
            response = await engine.run(flow_name=conversation.flow.id, user_message=text, session_id=session,
                                        config=conversation.config)
            if not response.success:
                raise RuntimeError(f"{conversation.name} on {kind}: {response.error_code} {response.message}")
            session = response.session
            clock.now += SECONDS_PER_TURN
    return tally(point.fake, len(conversation.turns))


def run_langgraph(conversation: Conversation, kind: str) -> Tally:
    from langgraph.checkpoint.memory import InMemorySaver

    from benchmarks.collection_langgraph import build_graph

    clock = Clock()
    point = endpoint(kind, conversation.replies, clock)
    with _serving(point.fake):
        graph = build_graph(point.langchain(), InMemorySaver())
        thread = {"configurable": {"thread_id": "bench"}}
        for text in conversation.turns:
            graph.invoke({"messages": [("user", text)]}, thread)
            clock.now += SECONDS_PER_TURN
    return tally(point.fake, len(conversation.turns))


class _serving:
    """Starts an HTTP fake for the block; an in-process one (Bedrock) needs nothing."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake

    def __enter__(self) -> Any:
        return self.fake.__enter__() if hasattr(self.fake, "__enter__") else self.fake

    def __exit__(self, *exc: object) -> None:
        if hasattr(self.fake, "__exit__"):
            self.fake.__exit__(*exc)


def _row(label: str, kind: str, t: Tally) -> str:
    prices = PRICES[kind]
    read_share = t.read / t.input if t.input else 0.0
    return (f"| {label} | {kind} | {t.calls} | {t.input:,} | {t.input / t.turns:,.0f} | {t.bytes_sent:,} | "
            f"{t.bytes_sent / t.turns:,.0f} | {t.read:,} ({read_share:.0%}) | {t.write:,} | "
            f"${t.cost(prices, cached=False):.4f} | ${t.cost(prices):.4f} |")


async def main() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")  # signing only; nothing leaves
    conversations = [reference("basic"), reference("hotel"), reference("home_insurance"), long_collection()]
    header = ("| conversation | rules | model calls | input tokens | per turn | bytes sent | per turn | "
              "cached (read) | cache writes | cost, no caching | cost, with caching |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows, goals = [], []
    for conversation in conversations:
        label = f"{conversation.name} ({len(conversation.turns)} turns)"
        for kind in ("openai", "anthropic", "bedrock"):
            result = await run_picoflow(conversation, kind)
            rows.append(_row(f"PicoFlow {label}", kind, result))
            share = result.read / result.input
            if kind != "bedrock" and conversation.flow.id in ("HotelFlow", "HomeInsuranceQuoteFlow"):
                goals.append(f"- {conversation.name} under {kind}'s rules: {share:.1%} of input tokens read from "
                             f"the cache" + (f" (goal at least {GOAL:.0%}: {'met' if share >= GOAL else 'missed'})"
                                             if kind == "anthropic" else " (reported, no goal)"))
            if kind == "anthropic":
                off = await run_picoflow(conversation, kind, prompt_cache=False)
                rows.append(_row(f"PicoFlow {label}, `prompt_cache: false`", kind, off))
            print(rows[-1], flush=True)
        if conversation.flow is ProfileCollectionFlow:
            for kind in ("openai", "anthropic", "bedrock"):
                rows.append(_row(f"LangGraph {label}", kind, run_langgraph(conversation, kind)))
                print(rows[-1], flush=True)
    prices = "; ".join(f"{kind} `{p.model}` ${p.input:.2f} input, ${p.read:.2f} cached read, "
                       f"${p.write:.2f} cache write, ${p.output:.2f} output" for kind, p in PRICES.items())
    body = f"""Each conversation runs once per provider's rules through its real LangChain client against a fake
endpoint that replays the scripted replies and reports usage as the provider does. Tokens are approximated as
4 UTF-8 bytes each (no tokenizer offline; OpenAI's prompt counted over the JSON of tools and messages, Anthropic's
and Bedrock's per content block); bytes sent are the HTTP request bodies (Bedrock: the Converse JSON).
A simulated {SECONDS_PER_TURN:.0f} s passes between turns (caches live 5 minutes). List prices per million tokens,
assumed from the providers' pricing pages as of October 2025: {prices}. "Cost, no caching" prices every input
token in full, as Anthropic and Bedrock bill requests without cache points (the `prompt_cache: false` rows).
LangGraph runs the same 200-turn collection (`benchmarks/collection_langgraph.py`) with plain clients: its
graph sends no cache points, as it would unless its author adds them.

{header}
{chr(10).join(rows)}

Goals (prompt caching, issue 28):
{chr(10).join(goals)}
"""
    write_section(TITLE, COMMAND, body)
    print(body)


if __name__ == "__main__":
    asyncio.run(main())
