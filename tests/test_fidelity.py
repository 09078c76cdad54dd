"""Behaviour pinned against the original framework's documentation, where a port most easily drifts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import BaseModel

from picoflow import Flow, ModelSelection, Step, ToolSpec, go, stay, tool
from picoflow.authoring.step_runs import RunStepRequest
from picoflow.errors import IllegalConversationError, PicoFlowError, public_message
from picoflow.models.scripted import ScriptedProvider, check_conversation, conversation_problems
from tests.support.engine import call, scripted_engine, text
from tests.support.fake_openai import CHAT_COMPLETIONS_PATH, FakeOpenAIServer


class NoArgs(BaseModel):
    pass


class LegacyStep(Step):
    returned: Any = None

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="pick", description="Pick", schema=NoArgs)]

    @tool
    async def pick(self, args: dict) -> Any:
        return LegacyStep.returned


class LegacyFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [LegacyStep(self)]


async def test_a_handler_returning_a_plain_object_fails_and_says_what_to_return():
    LegacyStep.returned = {"step": "LegacyStep", "state": {"picked": True}}
    engine, _ = scripted_engine([LegacyFlow], [call(("pick", {}))])
    response = await engine.run("LegacyFlow", "pick one")
    assert (response.error_code, response.message) == ("TURN_FAILED", public_message("TURN_FAILED"))
    assert "LegacyStep.pick' returned a dict" in response.detail and "go(Step)" in response.detail


async def test_a_handler_returning_none_is_no_transition():
    LegacyStep.returned = None
    engine, _ = scripted_engine([LegacyFlow], [call(("pick", {})), text("picked")])
    response = await engine.run("LegacyFlow", "pick one")
    assert (response.success, response.message) == (True, "picked")


# -- nested children that use tools: a trip planner ------------------------------------------------


class CityArgs(BaseModel):
    city: str


class SearchStep(Step):
    """A child that searches with a tool and answers with what it found."""

    kind = ""

    def get_prompt(self) -> str:
        return f"Find {self.kind} with search_{self.kind}, then summarise them in one line."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name=f"search_{self.kind}", description=f"Search {self.kind}", schema=CityArgs)]

    async def search(self, args: dict) -> Any:
        found = CATALOG[self.kind][args["city"]]
        self.save_state({"found": found})
        # The tool result goes back to this child's model; the child's reply becomes its result.
        return stay(f"Results: {', '.join(found)}")


class FlightSearchStep(SearchStep):
    kind = "flights"

    @tool("search_flights")
    async def search_flights(self, args: dict) -> Any:
        return await self.search(args)


class HotelSearchStep(SearchStep):
    kind = "hotels"

    @tool("search_hotels")
    async def search_hotels(self, args: dict) -> Any:
        return await self.search(args)


class ActivitySearchStep(SearchStep):
    kind = "activities"

    @tool("search_activities")
    async def search_activities(self, args: dict) -> Any:
        return await self.search(args)


CATALOG = {
    "flights": {"Rome": ["AZ 611", "FR 9402"]},
    "hotels": {"Rome": ["Hotel Artemide"]},
    "activities": {"Rome": ["Vatican Museums", "Colosseum at night"]},
}
SEARCHES = (FlightSearchStep, HotelSearchStep, ActivitySearchStep)


class TripPlanStep(Step):
    concurrent = False

    def get_prompt(self) -> str:
        return "Plan a trip: call plan_trip with the city, then present the plan."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="plan_trip", description="Plan a trip", schema=CityArgs)]

    @tool
    async def plan_trip(self, args: dict) -> Any:
        ask = f"Search in {args['city']}."
        if TripPlanStep.concurrent:
            batch = await self.run_steps([RunStepRequest(step=cls, user_message=ask) for cls in SEARCHES])
            found = [branch.output for branch in batch.branches]
        else:
            found = [await self.run_step(cls, ask) for cls in SEARCHES]
        return stay("Found:\n" + "\n".join(found))


class TripFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        # Planner and searches share one namespace, the hard case for a legal conversation.
        return [TripPlanStep(self).use_memory("trip"), *(cls(self).use_memory("trip") for cls in SEARCHES)]


def trip_script() -> list[dict[str, Any]]:
    """Replies keyed by step, so concurrent searches get theirs whatever order they call in."""
    script: list[dict[str, Any]] = [{"step": "TripPlanStep", **call(("plan_trip", {"city": "Rome"}))}]
    for cls in SEARCHES:
        script.append({"step": cls.__name__, **call((f"search_{cls.kind}", {"city": "Rome"}))})
        script.append({"step": cls.__name__, **text(f"{cls.kind}: " + ", ".join(CATALOG[cls.kind]["Rome"]))})
    script.append({"step": "TripPlanStep", **text("Your Rome trip: AZ 611, Hotel Artemide, the Vatican Museums.")})
    return script


@pytest.mark.parametrize("concurrent", [False, True], ids=["run_step", "run_steps"])
async def test_a_trip_planner_runs_searching_children_and_every_request_is_legal(concurrent):
    TripPlanStep.concurrent = concurrent
    engine, model = scripted_engine([TripFlow], trip_script())
    response = await engine.run("TripFlow", "Plan three days in Rome")
    assert response.success and response.message == "Your Rome trip: AZ 611, Hotel Artemide, the Vatican Museums."
    # The scripted model refuses illegal conversations, so every one of the 8 calls was a legal request.
    assert len(model.calls) == 8 and model.remaining == 0
    assert all(conversation_problems(request) == [] for request in model.calls)
    synthesis = str(model.calls[-1])
    assert "flights: AZ 611, FR 9402" in synthesis and "activities: Vatican Museums" in synthesis
    doc = await engine.session_store.load(response.session)
    assert doc.flow.current_step == "TripPlanStep"
    states = {s.name: s.state for s in doc.flow.steps}
    assert states["HotelSearchStep"]["found"] == ["Hotel Artemide"]
    stored = [m.model_dump(exclude_none=True) for m in doc.flow.memory["trip"].messages]
    assert conversation_problems([{"role": _ROLES[m["type"]], **_wire(m)} for m in stored[1:]]) == []


_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls") or [],
        "tool_call_id": message.get("tool_call_id"),
    }


async def test_a_child_moving_the_cursor_is_refused_with_what_to_do_instead():
    class RoguePlanStep(TripPlanStep):
        @tool("plan_trip")
        async def plan_trip(self, args: dict) -> Any:
            try:
                await self.run_step(RogueChild, "go")
            except PicoFlowError as exc:
                return stay(str(exc))
            return stay("no error")

    class RogueChild(FlightSearchStep):
        @tool("search_flights")
        async def search_flights(self, args: dict) -> Any:
            return go(RoguePlanStep)

    class RogueFlow(Flow):
        def config_model(self) -> ModelSelection:
            return ModelSelection(provider="openai", name="gpt-4o-mini")

        def define_steps(self) -> list[Step]:
            return [RoguePlanStep(self), RogueChild(self)]

    engine, model = scripted_engine(
        [RogueFlow], [call(("plan_trip", {"city": "Rome"})), call(("search_flights", {"city": "Rome"})), text("ok")]
    )
    response = await engine.run("RogueFlow", "plan")
    assert response.success
    assert "Return a result to the owning step instead" in str(model.calls[-1])


# -- the strict conversation check ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
          {"role": "user", "content": "next"}], "comes before the results of tool calls a"),
        ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "x", "tool_call_id": "b"}],
         "answers 'b'"),
        ([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}], "system messages lead it"),
        ([{"role": "user", "content": "  "}], "empty content"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "neither content nor tool"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}],
         "ends before the results"),
        ([], "no messages"),
    ],
    ids=["call-without-result", "result-without-call", "late-system", "empty-user", "empty-assistant",
         "trailing-call", "empty"],
)
def test_the_conversation_check_refuses_what_the_chat_service_refuses(messages, problem):
    problems = conversation_problems(messages)
    assert problems and problem in problems[0]
    with pytest.raises(IllegalConversationError):
        check_conversation(messages)


def test_a_legal_conversation_passes_the_check():
    assert conversation_problems([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
        {"role": "tool", "content": "1", "tool_call_id": "b"},
        {"role": "tool", "content": "2", "tool_call_id": "a"},
        {"role": "assistant", "content": "done"},
    ]) == []


async def test_the_scripted_model_refuses_an_illegal_request():
    provider = ScriptedProvider([text("never")])
    model = provider.chat_model(ModelSelection(provider="scripted", name="m"))
    illegal = [HumanMessage("hi"), AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "x"}])]
    with pytest.raises(IllegalConversationError):
        await model.ainvoke(illegal)
    assert provider.remaining == 1
    lenient = ScriptedProvider([text("fine")], strict=False).chat_model(ModelSelection(provider="s", name="m"))
    assert (await lenient.ainvoke(illegal)).content == "fine"


def test_keyed_replies_are_validated():
    with pytest.raises(PicoFlowError, match="names tools but no step"):
        ScriptedProvider([{"content": "x", "tools": ["a"]}])
    with pytest.raises(PicoFlowError, match="step must name"):
        ScriptedProvider([{"content": "x", "step": ""}])


def test_the_fake_chat_server_refuses_an_illegal_conversation_as_the_real_one_does():
    illegal = {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function",
                                                               "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "user", "content": "next"},
    ]}
    with FakeOpenAIServer([{"never": "served"}]) as server:
        request = urllib.request.Request(server.url + CHAT_COMPLETIONS_PATH, data=json.dumps(illegal).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 400
    assert "before the results of tool calls x" in json.loads(refused.value.read())["error"]["message"]
