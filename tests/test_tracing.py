"""OpenTelemetry GenAI spans: the tree of a HotelFlow search turn, failures, decisions, and what attributes carry.

The spans go to the process's global tracer provider, as ADOT or any SDK would configure it; each test reads
them from an in-memory exporter of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

from flows.hotel import HotelFlow
from picoflow import Flow, FlowEngine, ModelSelection, Step, tool
from picoflow.authoring.decision import ScriptedDecisionProvider
from picoflow.authoring.transitions import TOOL_VALIDATED
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.results import RunResponse
from picoflow.stores import MemorySessionStore
from picoflow.telemetry import CAPTURE_CONTENT_ENV, trace_only_context
from tests.support.engine import call, scripted_engine, text
from tests.test_decision import SupportFlow, answers, decision_engine

CONVERSATION = json.loads((Path(__file__).parents[1] / "flows" / "hotel" / "conversation.json").read_text())
SEARCH_TURN = 7
# The search turn's words, made distinctive so that finding them anywhere in an attribute means a leak.
SEARCH_WORDS = "search now please, my code word is Zanzibar-4471"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # later spans of the session are dropped


async def search_turn(exporter: InMemorySpanExporter) -> tuple[RunResponse, list[ReadableSpan]]:
    """HotelFlow's conversation up to its search turn; the search turn's response and spans."""
    replies = [reply for turn in CONVERSATION["turns"][: SEARCH_TURN + 1] for reply in turn["replies"]]
    engine = FlowEngine([HotelFlow], MemorySessionStore(), ProviderRegistry(override=ScriptedProvider(replies)))
    session = None
    for index, turn in enumerate(CONVERSATION["turns"][: SEARCH_TURN + 1]):
        exporter.clear()
        words = SEARCH_WORDS if index == SEARCH_TURN else turn["user"]
        response = await engine.run("HotelFlow", words, session, CONVERSATION["config"])
        assert response.success, response.message
        session = response.session
    return response, list(exporter.get_finished_spans())


def ours(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.instrumentation_scope and span.instrumentation_scope.name == "picoflow"]


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return sorted((span for span in spans if span.parent is not None and span.parent.span_id == parent.context.span_id),
                  key=lambda span: span.start_time or 0)


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from strings(item)


async def test_a_search_turn_is_a_tree_of_the_flow_its_steps_model_calls_and_tool_call(exported) -> None:
    response, spans = await search_turn(exported)
    mine = ours(spans)

    [root] = [span for span in mine if span.parent is None]
    assert root.name == "invoke_workflow HotelFlow"
    digest = hashlib.sha256(response.session.encode()).hexdigest()[:16]
    assert dict(root.attributes) == {
        "gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "HotelFlow",
        "gen_ai.agent.name": "HotelFlow", "gen_ai.conversation.id": digest, "picoflow.turn.completed": False,
    }
    # Every span of the turn names the session by the same digest, never by its id.
    assert {span.attributes["gen_ai.conversation.id"] for span in mine} == {digest}
    assert response.session not in {value for span in spans for value in strings(list(span.attributes.values()))}

    explore, present, summary = children(mine, root)
    assert (explore.name, present.name, summary.name) == ("invoke_agent ExploreStep", "invoke_agent PresentStep",
                                                          "chat gpt-4o")
    assert explore.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert explore.attributes["gen_ai.agent.name"] == "ExploreStep"
    assert explore.attributes["gen_ai.provider.name"] == "openai"

    chat, search = children(mine, explore)
    assert chat.name == "chat gpt-4o" and chat.kind == trace.SpanKind.CLIENT
    assert {key: chat.attributes[key] for key in (
        "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "picoflow.call.purpose",
        "picoflow.step", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons",
    )} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o",
        "picoflow.call.purpose": "chat", "picoflow.step": "ExploreStep", "gen_ai.usage.input_tokens": 702,
        "gen_ai.usage.output_tokens": 88, "gen_ai.response.finish_reasons": ("tool_calls",),
    }
    assert search.name == "execute_tool capture_choices"
    assert search.attributes["gen_ai.operation.name"] == "execute_tool"
    assert search.attributes["gen_ai.tool.call.id"] == "call_search_1"
    assert search.status.status_code == StatusCode.UNSET
    # The MCP SDK's own span of the search nests under the tool call that made it.
    assert "MCP send tools/call search_hotels" in [span.name for span in children(spans, search)]

    [answer] = children(mine, present)
    assert answer.attributes["picoflow.step"] == "PresentStep"
    assert answer.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert summary.attributes["picoflow.call.purpose"] == "summary"
    assert "picoflow.step" not in summary.attributes
    # The model spans account for the turn's tokens, the compaction summary's included.
    model_spans = [span for span in mine if span.name.startswith("chat ")]
    assert sum(span.attributes["gen_ai.usage.input_tokens"] for span in model_spans) == response.tokens.input_tokens
    assert sum(span.attributes["gen_ai.usage.output_tokens"] for span in model_spans) == response.tokens.output_tokens
    assert all(span.status.status_code == StatusCode.UNSET for span in mine)


async def test_the_mcp_sessions_discovery_nests_under_the_tool_call_that_opened_it(exported) -> None:
    # The search turn opens HotelFlow's MCP session: the SDK discovers the server (server/discover, or initialize
    # with an older server) from the task that holds the session open across turns, yet in the turn's trace.
    _, spans = await search_turn(exported)
    [root] = [span for span in ours(spans) if span.parent is None]
    by_id = {span.context.span_id: span for span in spans}
    discovery = [span for span in spans if span.name in ("MCP send server/discover", "MCP send initialize")]
    assert discovery, [(span.name, span.parent is None) for span in spans]
    for span in discovery:
        assert span.parent is not None and span.context.trace_id == root.context.trace_id
        assert by_id[span.parent.span_id].name == "execute_tool capture_choices"
    # No span of the turn starts a trace of its own.
    assert [span.name for span in spans if span.parent is None] == [root.name]


@pytest.mark.parametrize("opted_in", [False, True])
async def test_messages_and_tool_arguments_reach_spans_only_when_the_operator_opts_in(
    exported, monkeypatch: pytest.MonkeyPatch, opted_in: bool
) -> None:
    if opted_in:
        monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    _, spans = await search_turn(exported)
    recorded = [value for span in spans for value in strings(list(span.attributes.values()))]
    recorded += [value for span in spans for event in span.events for value in strings(list(event.attributes.values()))]
    searched = CONVERSATION["turns"][SEARCH_TURN]["replies"][0]["tool_calls"][0]["args"]["criteria"]
    # The user's words, earlier ones still in the history sent to the model, and the tool call's arguments.
    private = [SEARCH_WORDS, "free wifi, parking", searched["start"], "freeParking"]

    leaked = {word for word in private if any(word in value for value in recorded)}
    if not opted_in:
        assert leaked == set()
        return
    assert leaked == set(private)
    mine = {span.name: span for span in ours(spans)}
    [user] = json.loads(mine["invoke_workflow HotelFlow"].attributes["gen_ai.input.messages"])
    assert user == {"role": "user", "parts": [{"type": "text", "content": SEARCH_WORDS}]}
    search = mine["execute_tool capture_choices"]
    assert json.loads(search.attributes["gen_ai.tool.call.arguments"]) == {"criteria": searched}
    assert search.attributes["gen_ai.tool.call.result"] == TOOL_VALIDATED  # what the model was told


class Order(BaseModel):
    """An order to check."""

    id: int


class FaultyStep(Step):
    def get_prompt(self) -> str:
        return "Check the order."

    @tool
    async def check_order(self, args: Order) -> None:
        raise RuntimeError(f"order {args.id} is unreadable")


class FaultyFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="small-model", params={"temperature": 0.2})

    def define_steps(self) -> list[Step]:
        return [FaultyStep(self)]


async def test_a_failing_tool_marks_its_call_its_step_and_the_turn_failed_by_type_only(exported) -> None:
    engine, _ = scripted_engine([FaultyFlow], [call(("no_such_tool", {}), ("check_order", {"id": 7}))])

    response = await engine.run("FaultyFlow", "Where is my order?")

    assert not response.success
    spans = {span.name: span for span in ours(exported.get_finished_spans())}
    assert set(spans) == {"invoke_workflow FaultyFlow", "invoke_agent FaultyStep", "chat small-model",
                          "execute_tool no_such_tool", "execute_tool check_order"}
    assert spans["chat small-model"].attributes["gen_ai.request.temperature"] == 0.2
    # A call of a tool the step does not offer fails without running anything; a raising handler fails by type.
    assert spans["execute_tool no_such_tool"].attributes["error.type"] == "tool_error"
    for name in ("execute_tool check_order", "invoke_agent FaultyStep"):
        assert spans[name].attributes["error.type"] == "RuntimeError"
    assert spans["invoke_workflow FaultyFlow"].attributes["error.type"] == response.error_code
    for span in spans.values():
        if span.name != "chat small-model":
            assert span.status.status_code == StatusCode.ERROR
            assert not span.status.description and not span.events


async def test_a_decision_is_a_decision_model_call_and_its_route_marks_the_step(exported) -> None:
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([answers("specialist")]),
                                [text("A specialist will look at it.")])

    response = await engine.run("SupportFlow", "My cluster is down", config={"tier": "gold"})

    assert response.success, response.message
    spans = ours(exported.get_finished_spans())
    [intake] = [span for span in spans if span.name == "invoke_agent IntakeStep"]
    assert intake.attributes["picoflow.decision.route"] == "SpecialistStep"
    [decision] = children(spans, intake)
    assert decision.name == "chat jev-test"
    assert decision.attributes["picoflow.call.purpose"] == "decision"
    assert decision.attributes["gen_ai.provider.name"] == "decider"
    [specialist] = [span for span in spans if span.name == "invoke_agent SpecialistStep"]
    assert [span.attributes["picoflow.call.purpose"] for span in children(spans, specialist)] == ["chat"]


async def test_a_task_started_in_a_trace_only_context_keeps_the_trace_and_nothing_else(exported) -> None:
    # What an MCP session's holding task starts in: the opener's span stays its parent, while the opener's other
    # context variables (a turn's deadline among them) do not follow it.
    other: contextvars.ContextVar[str | None] = contextvars.ContextVar("other", default=None)
    other.set("the turn's")
    with trace.get_tracer("test").start_as_current_span("opener") as opener:
        seen = await asyncio.create_task(_current_and_other(other), context=trace_only_context())
    assert seen == (opener.get_span_context().span_id, None)


async def _current_and_other(other: contextvars.ContextVar[str | None]) -> tuple[int, str | None]:
    return trace.get_current_span().get_span_context().span_id, other.get()
