"""DecisionStep: typed questions, validated answers, routing, retries, recovery, refusals and usage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel

from picoflow import (
    DecisionStep,
    Flow,
    FlowEngine,
    LogicStep,
    ModelSelection,
    Step,
    ToolSpec,
    direct,
    direct_to,
    finish,
    go,
    render,
    tool,
)
from picoflow.authoring.decision import (
    ChatDecisionProvider,
    Choice,
    ChoiceAnswer,
    DecisionConfig,
    DecisionContext,
    DecisionErrorContext,
    DecisionRequest,
    DecisionResult,
    Noul,
    Score,
    ScoreAnswer,
    ScriptedDecisionProvider,
)
from picoflow.authoring.step_registry import collect_steps
from picoflow.conversation.requests import read_conversation
from picoflow.errors import DecisionValidationError, PicoFlowError, public_message
from picoflow.messages import AiMessageEx, HumanMessageEx
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.document import SessionDoc, TokenUsage
from picoflow.stores import MemorySessionStore
from tests.support.engine import call, scripted_engine, text

CHAT = ModelSelection(provider="scripted", name="chat-model")
DECIDER = ModelSelection(provider="decider", name="jev-test")

ROUTE = Choice(criteria={"quick": "A straightforward request", "specialist": "A complex request"})
BLOCKED = Noul(instructions="Is a production operation blocked?")
URGENCY = Score(criteria=["Can wait", "Soon", "Right now"])


def choice(label: str, **probabilities: float) -> dict[str, Any]:
    return {"choice": label, "probabilities": probabilities, "confidence": probabilities[label]}


def answers(route: str = "quick", blocked: float = 0.1, score: float = 0.4) -> dict[str, Any]:
    other = "specialist" if route == "quick" else "quick"
    return {
        "route": choice(route, **{route: 0.8, other: 0.2}),
        "blocked": {"noul": blocked},
        "urgency": {"score": score, "probabilities": [0.7, 0.2, 0.1], "confidence": 0.7},
    }


# -- the flow under test ------------------------------------------------------------------------


class QuickStep(Step):
    def get_prompt(self) -> str:
        return "Handle the quick request."


class SpecialistStep(Step):
    def get_prompt(self) -> str:
        return "Handle the complex request."


class IntakeStep(DecisionStep):
    """Routes on three questions; records what it saw so the tests can inspect it."""

    seen: list[tuple[dict[str, Any], DecisionContext]] = []
    errors: list[tuple[Exception, DecisionErrorContext]] = []

    def define_questions(self) -> dict[str, Any]:
        return {"route": ROUTE, "blocked": BLOCKED, "urgency": URGENCY}

    def get_prompt(self) -> str:
        return "Classify the current support request."

    def get_decision_facts(self) -> dict[str, Any]:
        return {"tier": self.get_context("config.tier") or "free", "open_tickets": [1, 2]}

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        IntakeStep.seen.append((answers, context))
        self.save_state({"route": answers["route"].choice, "blocked": answers["blocked"].noul})
        if answers["route"].choice == "specialist":
            return go(SpecialistStep)
        return direct_to(QuickStep, "I can handle that in the quick path.")


class SupportFlow(Flow):
    flow_fallback: Any = None
    flow_errors: list[Exception] = []

    def config_model(self) -> ModelSelection:
        return CHAT

    def config_decision(self) -> dict[str, Any]:
        return {"model": DECIDER}

    def define_steps(self) -> list[Step]:
        return [IntakeStep(self), QuickStep(self), SpecialistStep(self)]

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        SupportFlow.flow_errors.append(error)
        return SupportFlow.flow_fallback


@pytest.fixture(autouse=True)
def _reset_recorders() -> None:
    IntakeStep.seen = []
    IntakeStep.errors = []
    SupportFlow.flow_fallback = None
    SupportFlow.flow_errors = []


def decision_engine(
    flows: list[type[Flow]], decisions: ScriptedDecisionProvider, replies: list[Any] | None = None
) -> tuple[FlowEngine, ScriptedProvider]:
    chat = ScriptedProvider(replies or [])
    engine = FlowEngine(
        flows=flows,
        session_store=MemorySessionStore(),
        providers=ProviderRegistry(override=chat),
        retry_delay=0,
        decision_providers={"decider": decisions},
    )
    return engine, chat


async def stored(engine: FlowEngine, session_id: str) -> dict[str, Any]:
    doc = await engine.session_store.load(session_id)
    assert doc is not None
    return doc.to_json_dict()


# -- routing -------------------------------------------------------------------------------------


async def test_a_choice_routes_with_go_and_the_next_step_answers_in_the_same_turn():
    decisions = ScriptedDecisionProvider([answers("specialist")])
    engine, chat = decision_engine([SupportFlow], decisions, [text("A specialist will look at it.")])

    response = await engine.run("SupportFlow", "My cluster is down", config={"tier": "gold"})

    assert response.success, response.message
    assert response.message == "A specialist will look at it."
    doc = await stored(engine, response.session)
    assert doc["flow"]["currentStep"] == "SpecialistStep"
    intake = next(s for s in doc["flow"]["steps"] if s["name"] == "IntakeStep")
    assert intake["state"]["route"] == "specialist"
    assert [item["stepName"] for item in doc["flow"]["sequence"]] == ["IntakeStep", "SpecialistStep"]
    assert len(chat.calls) == 1


async def test_direct_to_moves_the_cursor_and_answers_verbatim_without_a_model_call():
    engine, chat = decision_engine([SupportFlow], ScriptedDecisionProvider([answers("quick")]))

    response = await engine.run("SupportFlow", "How do I reset my password?")

    assert response.success, response.message
    assert response.message == "I can handle that in the quick path."
    assert (await stored(engine, response.session))["flow"]["currentStep"] == "QuickStep"
    assert chat.calls == []


async def test_score_and_noul_answers_arrive_typed_with_a_derived_legend():
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([answers("quick", blocked=0.93, score=1.6)]))

    await engine.run("SupportFlow", "Deploys are failing")

    (received, context), = IntakeStep.seen
    assert isinstance(received["route"], ChoiceAnswer)
    assert received["route"].probabilities == {"quick": 0.8, "specialist": 0.2}
    assert received["blocked"].noul == 0.93
    assert received["urgency"].score == 1.6
    assert received["urgency"].legend == "Right now"
    assert (context.step_id, context.provider, context.model, context.attempts) == (
        "IntakeStep", "decider", "jev-test", 1
    )


class FinishingStep(IntakeStep):
    id = "IntakeStep"

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        return finish("All done.")


class FinishingFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [FinishingStep(self), QuickStep(self), SpecialistStep(self)]


async def test_finish_completes_the_session_and_keeps_the_cursor():
    engine, _ = decision_engine([FinishingFlow], ScriptedDecisionProvider([answers()]))

    response = await engine.run("FinishingFlow", "Thanks, that is all")

    assert (response.success, response.completed, response.message) == (True, True, "All done.")
    doc = await stored(engine, response.session)
    assert (doc["runStatus"], doc["flow"]["currentStep"]) == ("completed", "IntakeStep")
    assert doc["flow"]["memory"]["IntakeStep"]["messages"][-1]["id"].startswith("IntakeStep|")


class TextReplyStep(IntakeStep):
    id = "IntakeStep"
    reply: Any = "Sure, I will route you."

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        return TextReplyStep.reply


class TextReplyFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [TextReplyStep(self), QuickStep(self), SpecialistStep(self)]


async def test_plain_text_from_on_decision_is_an_error_pointing_at_direct_to():
    engine, _ = decision_engine([TextReplyFlow], ScriptedDecisionProvider([answers()]))

    response = await engine.run("TextReplyFlow", "Hello")

    assert not response.success and response.message == public_message(response.error_code)
    assert "direct_to(Step, text)" in response.detail and "finish(text)" in response.detail
    assert (await stored(engine, response.session))["runStatus"] == "aborted"


async def test_a_registered_step_name_from_on_decision_routes():
    TextReplyStep.reply = "QuickStep"
    try:
        engine, _ = decision_engine([TextReplyFlow], ScriptedDecisionProvider([answers()]), [text("Quick answer.")])
        response = await engine.run("TextReplyFlow", "Hello")
    finally:
        TextReplyStep.reply = "Sure, I will route you."

    assert (response.success, response.message) == (True, "Quick answer.")


# -- input: questions, guidance, facts and conversation --------------------------------------------


async def test_the_provider_receives_guided_questions_facts_and_the_request():
    decisions = ScriptedDecisionProvider([answers()])
    engine, _ = decision_engine([SupportFlow], decisions)

    await engine.run("SupportFlow", "Deploys are failing", config={"tier": "gold"})

    (request,) = decisions.requests
    assert isinstance(request, DecisionRequest)
    assert (request.step_id, request.selection) == ("IntakeStep", DECIDER)
    assert request.state == {
        "tier": "gold",
        "open_tickets": [1, 2],
        "request": "Deploys are failing",
        "priorRequests": [],
    }
    assert request.questions["blocked"].instructions == (
        "Classify the current support request.\n\nIs a production operation blocked?"
    )
    assert request.questions["route"].instructions == "Classify the current support request."
    assert request.questions["route"].criteria == ROUTE.criteria


class DeskStep(Step):
    """A chat step sharing its namespace with the decision step; its tool hands over to it."""

    class HandOver(BaseModel):
        reason: str = ""

    def get_prompt(self) -> str:
        return "Talk with the customer; call hand_over when they have described the problem."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="hand_over", description="Hand the case to triage.", schema=self.HandOver)]

    @tool
    async def hand_over(self, args: dict[str, Any]) -> Any:
        return go(TriageStep)


class TriageStep(DecisionStep):
    def define_questions(self) -> dict[str, Any]:
        return {"route": ROUTE}

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        IntakeStep.seen.append((answers, context))
        return go(SpecialistStep) if answers["route"].choice == "specialist" else direct_to(QuickStep, "Quick path.")


class DeskFlow(Flow):
    def config_model(self) -> ModelSelection:
        return CHAT

    def define_steps(self) -> list[Step]:
        return [
            DeskStep(self).use_memory("desk"),
            TriageStep(self).use_memory("desk"),
            QuickStep(self),
            SpecialistStep(self).use_memory("desk"),
        ]


async def test_prior_requests_come_from_the_namespace_without_navigation_messages():
    decisions = ScriptedDecisionProvider([{"route": choice("quick", quick=0.9, specialist=0.1)}])
    engine = FlowEngine(
        flows=[DeskFlow],
        session_store=MemorySessionStore(),
        providers=ProviderRegistry(override=ScriptedProvider([text("Tell me more."), text("Go on."), call(
            ("hand_over", {"reason": "described"}))])),
        retry_delay=0,
        decision_providers={"scripted": decisions},
    )
    first = await engine.run("DeskFlow", "Hi")
    await engine.run("DeskFlow", "My printer jams", first.session)
    last = await engine.run("DeskFlow", "Only on duplex jobs", first.session)

    assert (last.success, last.message) == (True, "Quick path.")
    (request,) = decisions.requests
    assert request.state == {"request": "Only on duplex jobs", "priorRequests": ["Hi", "My printer jams"]}
    desk = (await stored(engine, first.session))["flow"]["memory"]["desk"]["messages"]
    humans = [(m["content"], m["additional_kwargs"]["origin"]) for m in desk if m["type"] == "human"]
    # The framework's own opener and hand-over messages are in memory, marked as its own, and never reached
    # the provider.
    assert humans == [("Start", "framework"), ("Hi", "user"), ("My printer jams", "user"),
                      ("Only on duplex jobs", "user"), ("Continue to step:TriageStep", "framework")]


def test_read_conversation_keeps_the_newest_requests_and_explicit_messages():
    messages = [
        SystemMessage(content=""),
        HumanMessageEx("Desk", "Start", origin="framework"),
        *[HumanMessageEx("Desk", f"request {n}") for n in range(1, 7)],
        AiMessageEx("Desk", "an answer"),
        HumanMessageEx("Desk", "Continue to step:TriageStep", origin="framework"),
        HumanMessageEx("Desk", "forwarded with with_message"),
    ]

    conversation = read_conversation(messages, ["TriageStep"])
    assert conversation.request == "forwarded with with_message"
    assert conversation.prior_requests == ("request 3", "request 4", "request 5", "request 6")
    assert read_conversation(messages, ["TriageStep"], 1).prior_requests == ("request 6",)
    assert read_conversation(messages, ["TriageStep"], 0).prior_requests == ()
    assert read_conversation([SystemMessage(content="")], []).as_state() == {"request": "", "priorRequests": []}
    with pytest.raises(PicoFlowError, match="max_prior_requests"):
        read_conversation(messages, [], -1)


async def test_flow_get_conversation_reads_a_namespace_without_creating_it():
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([answers()]))
    response = await engine.run("SupportFlow", "Deploys are failing")
    flow = SupportFlow()
    collect_steps(flow)
    flow.run_context.bind(await engine.session_store.load(response.session))

    assert flow.get_conversation("IntakeStep").request == "Deploys are failing"
    assert flow.get_conversation("nowhere").request == ""
    assert "nowhere" not in flow.get_memory().names()


async def test_flow_get_conversation_serialises_and_renders_as_the_original_json():
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([answers()]))
    first = await engine.run("SupportFlow", "Deploys are failing")
    flow = SupportFlow()
    collect_steps(flow)
    flow.run_context.bind(await engine.session_store.load(first.session))
    flow.get_memory().namespace("IntakeStep").messages.append(HumanMessageEx("IntakeStep", "Since this morning"))

    conversation = flow.get_conversation("IntakeStep")
    expected = '{"request": "Since this morning", "priorRequests": ["Deploys are failing"]}'
    assert json.dumps(conversation) == expected
    assert render("Conversation: {{CONVERSATION}}", CONVERSATION=conversation) == f"Conversation: {expected}"
    assert (conversation.request, conversation.prior_requests) == ("Since this morning", ("Deploys are failing",))
    assert conversation.as_state() == json.loads(expected)
    with pytest.raises(TypeError):
        conversation["request"] = "changed"


class ListeningStep(DecisionStep):
    """Answers with what it heard and keeps the cursor, so every turn is decided here."""

    def define_questions(self) -> dict[str, Any]:
        return {"route": ROUTE}

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        return direct_to(ListeningStep, json.dumps([context.request, *context.prior_requests]))


class ListeningFlow(Flow):
    def config_model(self) -> ModelSelection:
        return CHAT

    def config_decision(self) -> dict[str, Any]:
        return {"model": DECIDER}

    def define_steps(self) -> list[Step]:
        return [ListeningStep(self)]


async def test_a_user_typing_the_frameworks_navigation_text_is_heard_by_decisions():
    engine, _ = decision_engine([ListeningFlow], ScriptedDecisionProvider([{"route": answers()["route"]}] * 2))

    first = await engine.run("ListeningFlow", "Start")
    second = await engine.run("ListeningFlow", "Continue to step:ListeningStep", first.session)

    assert json.loads(first.message) == ["Start"]
    assert json.loads(second.message) == ["Continue to step:ListeningStep", "Start"]
    messages = (await stored(engine, first.session))["flow"]["memory"]["ListeningStep"]["messages"]
    humans = [(m["content"], m["additional_kwargs"]["origin"]) for m in messages if m["type"] == "human"]
    # The stored document says who wrote each message.
    assert humans == [("Start", "user"), ("Continue to step:ListeningStep", "user")]


async def test_documents_stored_without_origins_load_and_tell_navigation_by_its_text():
    engine, _ = decision_engine([ListeningFlow], ScriptedDecisionProvider([{"route": answers()["route"]}] * 2))
    first = await engine.run("ListeningFlow", "Deploys are failing")
    # The same document as it was stored before messages recorded their origin.
    old = await stored(engine, first.session)
    for message in old["flow"]["memory"]["ListeningStep"]["messages"]:
        message.get("additional_kwargs", {}).pop("origin", None)
    assert "origin" not in json.dumps(old)
    await engine.session_store.save(SessionDoc.model_validate(old), old["revision"])

    second = await engine.run("ListeningFlow", "Still failing", first.session)

    assert second.success, second.detail
    assert json.loads(second.message) == ["Still failing", "Deploys are failing"]  # the old opener is left out


class FactsStep(IntakeStep):
    id = "IntakeStep"
    facts: Any = {}

    def get_decision_facts(self) -> Any:
        return FactsStep.facts


class FactsFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [FactsStep(self), QuickStep(self), SpecialistStep(self)]


@pytest.mark.parametrize(
    ("facts", "problem"),
    [
        ({"request": "overridden"}, "cannot set request"),
        ({"priorRequests": []}, "cannot set priorRequests"),
        ({"when": {1, 2}}, "JSON-compatible"),
        ({"ratio": float("nan")}, "non-finite"),
        ({"nested": {3: "x"}}, "non-string key"),
        (["not", "a", "dict"], "must return a dict"),
    ],
)
async def test_reserved_or_non_json_facts_fail_loudly_outside_the_fallback_chain(facts: Any, problem: str):
    FactsStep.facts = facts
    SupportFlow.flow_fallback = direct_to(QuickStep, "fallback")
    decisions = ScriptedDecisionProvider([answers()])
    engine, _ = decision_engine([FactsFlow], decisions)

    response = await engine.run("FactsFlow", "Hello")

    assert not response.success and response.message == public_message(response.error_code)
    assert problem in response.detail
    assert decisions.requests == [] and SupportFlow.flow_errors == [] and IntakeStep.seen == []


# -- validation --------------------------------------------------------------------------------------


def invalid(**changes: Any) -> dict[str, Any]:
    base = answers()
    for key, value in changes.items():
        question, _, field = key.partition("__")
        if field:
            base[question] = {**base[question], field: value}
        elif value is None:
            base.pop(question)
        else:
            base[question] = value
    return base


INVALID_ANSWERS = {
    "unknown label": invalid(route=choice("other", other=0.8, quick=0.1, specialist=0.1)),
    "probabilities miss a label": invalid(route__probabilities={"quick": 1.0}),
    "probabilities do not sum to one": invalid(route__probabilities={"quick": 0.4, "specialist": 0.2}),
    "negative probability": invalid(route__probabilities={"quick": 1.2, "specialist": -0.2}),
    "confidence above one": invalid(route__confidence=1.5),
    "text instead of a number": invalid(blocked__noul="0.7"),
    "noul above one": invalid(blocked__noul=1.2),
    "score above the last level": invalid(urgency__score=2.5),
    "negative score": invalid(urgency__score=-0.1),
    "one probability per level": invalid(urgency__probabilities=[0.5, 0.5]),
    "wrong legend": invalid(urgency__legend="Soon"),
    "legend by level names another criterion": invalid(urgency__legend={"0": "Soon"}),
    "legend by level misses the nearest level": invalid(urgency__legend={"1": "Soon"}),
    "probabilities by level miss a level": invalid(urgency__probabilities={"0": 0.7, "1": 0.3}),
    "probabilities by level name no level": invalid(urgency__probabilities={"0": 0.7, "1": 0.2, "3": 0.1}),
    "answer of the wrong type": invalid(blocked=choice("quick", quick=0.8, specialist=0.2)),
    "missing answer": invalid(urgency=None),
    "unknown question": {**answers(), "extra": {"noul": 0.5}},
    "not a mapping": DecisionResult(answers=["quick"]),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("bad", list(INVALID_ANSWERS.values()), ids=list(INVALID_ANSWERS))
async def test_invalid_answers_never_reach_on_decision_and_are_not_retried(bad: Any):
    SupportFlow.flow_fallback = direct_to(QuickStep, "Let me take the quick path while triage is down.")
    decisions = ScriptedDecisionProvider([bad, answers()])
    engine, _ = decision_engine([SupportFlow], decisions)

    response = await engine.run("SupportFlow", "Hello")

    assert (response.success, response.message) == (True, "Let me take the quick path while triage is down.")
    assert IntakeStep.seen == []
    assert len(decisions.requests) == 1
    (error,) = SupportFlow.flow_errors
    assert isinstance(error, DecisionValidationError)


async def test_valid_edge_answers_are_accepted():
    edge = {
        "route": {"choice": "quick", "probabilities": {"quick": 0.333, "specialist": 0.667}, "confidence": 0},
        "blocked": {"noul": 1},
        "urgency": {"score": 2, "probabilities": [0, 0, 1], "confidence": 1, "legend": "Right now"},
    }
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([edge]))

    response = await engine.run("SupportFlow", "Hello")

    assert response.success, response.message
    (received, _), = IntakeStep.seen
    assert received["urgency"].legend == "Right now" and received["blocked"].noul == 1.0


SCORE_SHAPES = {
    "json keys": {"score": 0.4, "probabilities": {"0": 0.7, "1": 0.2, "2": 0.1}, "confidence": 0.7,
                  "legend": {"0": "Can wait", "1": "Soon", "2": "Right now"}},
    "int keys, nearest level only": {"score": 0.4, "probabilities": {2: 0.1, 0: 0.7, 1: 0.2}, "confidence": 0.7,
                                     "legend": {0: "Can wait"}},
    "typed, no legend": ScoreAnswer(score=0.4, probabilities=[0.7, 0.2, 0.1], confidence=0.7),
    "typed, legend None": ScoreAnswer(score=0.4, probabilities=[0.7, 0.2, 0.1], confidence=0.7, legend=None),
}


@pytest.mark.parametrize("urgency", list(SCORE_SHAPES.values()), ids=list(SCORE_SHAPES))
async def test_score_answers_built_in_python_or_in_the_documented_shape_are_accepted(urgency: Any):
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([{**answers(), "urgency": urgency}]))

    response = await engine.run("SupportFlow", "Hello")

    assert response.success, response.message
    (received, _), = IntakeStep.seen
    assert received["urgency"] == ScoreAnswer(score=0.4, probabilities=[0.7, 0.2, 0.1], confidence=0.7,
                                              legend="Can wait")


# -- failures, retries and recovery -------------------------------------------------------------------


class RecoveringStep(IntakeStep):
    id = "IntakeStep"
    step_fallback: Any = None

    def config_decision(self) -> dict[str, Any]:
        return {"max_retries": 2}

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        IntakeStep.errors.append((error, context))
        return RecoveringStep.step_fallback


class RecoveringFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [RecoveringStep(self), QuickStep(self), SpecialistStep(self)]


@pytest.fixture(autouse=True)
def _reset_step_fallback() -> None:
    RecoveringStep.step_fallback = None


async def test_transient_failures_are_retried_max_retries_more_times():
    decisions = ScriptedDecisionProvider([ConnectionError("reset"), TimeoutError(), answers("quick")])
    engine, _ = decision_engine([RecoveringFlow], decisions)

    response = await engine.run("RecoveringFlow", "Hello")

    assert (response.success, response.message) == (True, "I can handle that in the quick path.")
    assert len(decisions.requests) == 3
    (_, context), = IntakeStep.seen
    assert context.attempts == 3
    assert IntakeStep.errors == []
    # Only the response is counted: failed attempts never reached one.
    assert (await stored(engine, response.session))["decisionUsage"]["calls"] == 1


async def test_an_exhausted_retry_budget_goes_to_the_step_hook_first():
    RecoveringStep.step_fallback = direct_to(QuickStep, "Triage is unavailable; quick path it is.")
    SupportFlow.flow_fallback = finish("not used")
    decisions = ScriptedDecisionProvider([ConnectionError("503")] * 3 + [answers()])
    engine, _ = decision_engine([RecoveringFlow], decisions)

    response = await engine.run("RecoveringFlow", "Hello")

    assert (response.success, response.message) == (True, "Triage is unavailable; quick path it is.")
    assert len(decisions.requests) == 3
    ((error, context),) = IntakeStep.errors
    assert isinstance(error, ConnectionError) and str(error) == "503"
    assert (context.step_id, context.provider, context.model, context.attempts) == (
        "IntakeStep", "decider", "jev-test", 3
    )
    assert context.request == "Hello"
    assert SupportFlow.flow_errors == []


async def test_the_flow_hook_recovers_when_the_step_hook_declines():
    SupportFlow.flow_fallback = go(SpecialistStep)
    decisions = ScriptedDecisionProvider([ConnectionError("503")] * 3)
    engine, chat = decision_engine([RecoveringFlow], decisions, [text("A specialist will call you.")])

    response = await engine.run("RecoveringFlow", "Hello")

    assert (response.success, response.message) == (True, "A specialist will call you.")
    assert len(IntakeStep.errors) == 1 and len(SupportFlow.flow_errors) == 1


async def test_the_failure_propagates_and_aborts_the_session_when_no_hook_recovers():
    decisions = ScriptedDecisionProvider([RuntimeError("decision service down")] * 2)
    engine, _ = decision_engine([SupportFlow], decisions)

    response = await engine.run("SupportFlow", "Hello")

    assert not response.success
    assert response.error_code == "TURN_FAILED" and response.message == public_message("TURN_FAILED")
    assert "decision service down" in response.detail
    assert len(decisions.requests) == 1  # by default a failed decision call is not retried
    doc = await stored(engine, response.session)
    assert doc["runStatus"] == "aborted"
    assert doc["error"][-1]["errorType"] == "RuntimeError"


async def test_a_validation_failure_propagates_with_its_code_when_no_hook_recovers():
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([invalid(blocked__noul=3.0)]))

    response = await engine.run("SupportFlow", "Hello")

    assert (response.success, response.error_code) == (False, "DECISION_INVALID")
    assert (await stored(engine, response.session))["runStatus"] == "aborted"


async def test_framework_errors_from_the_provider_are_not_retried():
    decisions = ScriptedDecisionProvider([PicoFlowError("misconfigured"), answers()])
    engine, _ = decision_engine([RecoveringFlow], decisions)

    response = await engine.run("RecoveringFlow", "Hello")

    assert not response.success
    assert len(decisions.requests) == 1
    assert len(IntakeStep.errors) == 1


async def test_an_error_of_the_providers_own_code_is_not_retried():
    decisions = ScriptedDecisionProvider([KeyError("plan"), answers()])
    engine, _ = decision_engine([RecoveringFlow], decisions)

    response = await engine.run("RecoveringFlow", "Hello")

    assert not response.success
    assert len(decisions.requests) == 1
    ((error, context),) = IntakeStep.errors
    assert isinstance(error, KeyError) and context.attempts == 1


class SlowThenFine:
    """A provider whose first attempt overruns the per-attempt deadline."""

    def __init__(self) -> None:
        self.calls = 0

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(5)
        return DecisionResult(answers=answers(), usage=TokenUsage(input_tokens=3, output_tokens=1, total_tokens=4))


class Picky(ScriptedDecisionProvider):
    def should_retry(self, error: Exception) -> bool:
        return isinstance(error, TimeoutError)


async def test_a_timed_out_attempt_is_retried_and_providers_may_classify_their_errors():
    slow = SlowThenFine()
    engine = FlowEngine(flows=[SupportFlow], session_store=MemorySessionStore(), retry_delay=0,
                        providers=ProviderRegistry(override=ScriptedProvider([])), decision_providers={"decider": slow})

    class TimedFlow(SupportFlow):
        def define_steps(self) -> list[Step]:
            return [IntakeStep(self).use_decision(timeout_ms=50, max_retries=1), QuickStep(self), SpecialistStep(self)]

    engine.register_flow(TimedFlow)
    response = await engine.run("TimedFlow", "Hello")
    assert response.success, response.message
    assert slow.calls == 2 and IntakeStep.seen[0][1].attempts == 2

    picky = Picky([ValueError("bad request"), answers()])
    engine.decision_providers["decider"] = picky
    response = await engine.run("TimedFlow", "Hello")  # one retry allowed, but the provider calls it permanent
    assert not response.success and len(picky.requests) == 1


# -- configuration and refusals -----------------------------------------------------------------------


def collected(flow_cls: type[Flow]) -> Flow:
    flow = flow_cls()
    collect_steps(flow)
    return flow


def test_decision_options_resolve_flow_then_step_then_use_decision():
    class Configured(IntakeStep):
        id = "IntakeStep"

        def config_decision(self) -> dict[str, Any]:
            return {"max_retries": 3, "timeout_ms": 2000}

    class ConfiguredFlow(SupportFlow):
        def define_steps(self) -> list[Step]:
            return [Configured(self).use_decision(timeout_ms=500)]

    config = collected(ConfiguredFlow).require_step("IntakeStep").decision_config()
    assert (config.model, config.max_retries, config.timeout_ms) == (DECIDER, 3, 500)

    class Defaults(Flow):
        def config_model(self) -> ModelSelection:
            return CHAT

        def define_steps(self) -> list[Step]:
            return [IntakeStep(self)]

    config = collected(Defaults).require_step("IntakeStep").decision_config()
    assert (config.model, config.max_retries, config.timeout_ms) == (CHAT, 0, 30_000)

    class NoAttemptLimit(Defaults):
        def config_decision(self) -> dict[str, Any]:
            return {"timeout_ms": None}

    assert collected(NoAttemptLimit).require_step("IntakeStep").decision_config().timeout_ms is None


def test_invalid_decision_options_are_refused():
    flow = collected(SupportFlow)
    with pytest.raises(PicoFlowError, match="unknown option"):
        IntakeStep(flow).use_decision(retries=2)
    with pytest.raises(PicoFlowError, match="max_retries"):
        IntakeStep(flow).use_decision(max_retries=-1).decision_config()
    with pytest.raises(PicoFlowError, match="max_retries"):
        IntakeStep(flow).use_decision(max_retries=True).decision_config()


class DocumentedConfigFlow(SupportFlow):
    decision: Any = {"provider": "typesafe", "model": "jev-latest", "timeoutMs": 15_000, "maxRetries": 2}

    def config_decision(self) -> Any:
        return DocumentedConfigFlow.decision


@pytest.mark.parametrize("decision", [
    {"provider": "typesafe", "model": "jev-latest", "timeoutMs": 15_000, "maxRetries": 2},
    {"provider": "typesafe", "model": "jev-latest", "timeout_ms": 15_000, "max_retries": 2},
    DecisionConfig(provider="typesafe", model="jev-latest", timeoutMs=15_000, maxRetries=2),
    DecisionConfig(model=ModelSelection(provider="typesafe", name="jev-latest"), timeout_ms=15_000, max_retries=2),
])
async def test_the_documented_decision_configuration_is_accepted_and_used(decision: Any, monkeypatch):
    monkeypatch.setattr(DocumentedConfigFlow, "decision", decision)
    typesafe = ScriptedDecisionProvider([TimeoutError(), ConnectionError("reset"), answers()])
    engine = FlowEngine(flows=[DocumentedConfigFlow], session_store=MemorySessionStore(), retry_delay=0,
                        providers=ProviderRegistry([ScriptedProvider([])]), decision_providers={"typesafe": typesafe})

    response = await engine.run("DocumentedConfigFlow", "Hello")

    assert response.success, response.detail
    assert len(typesafe.requests) == 3  # maxRetries 2: three attempts
    assert {(r.selection.provider, r.selection.name, r.timeout_ms) for r in typesafe.requests} == {
        ("typesafe", "jev-latest", 15_000)}


def test_a_model_name_alone_is_a_model_of_the_flows_chat_provider():
    class NamedModel(SupportFlow):
        def config_decision(self) -> dict[str, Any]:
            return {"model": "small-classifier", "maxRetries": 1}

    config = collected(NamedModel).require_step("IntakeStep").decision_config()
    assert (config.provider, config.selection, config.max_retries) == (
        "scripted", ModelSelection(provider="scripted", name="small-classifier"), 1)


@pytest.mark.parametrize(("decision", "problem"), [
    ({"timeoutMs": -5}, r"config_decision\(\) has an invalid decision option \(timeoutMs: .*greater than 0"),
    ({"retries": 2}, "unknown decision option.*retries.*accepted: provider, model, timeoutMs"),
    ({"provider": "typesafe"}, "'typesafe' needs a model name: add model="),
    ({"provider": "nowhere", "model": "m"}, "'nowhere' is neither a registered decision provider.*Register it with"),
    ("typesafe", "must give a dict or a DecisionConfig"),
])
def test_a_wrong_decision_configuration_fails_when_the_flow_is_registered(decision: Any, problem: str, monkeypatch):
    monkeypatch.setattr(DocumentedConfigFlow, "decision", decision)
    typesafe = ScriptedDecisionProvider([])

    with pytest.raises(PicoFlowError, match=f"Flow 'DocumentedConfigFlow', DecisionStep 'IntakeStep': .*{problem}"):
        FlowEngine(flows=[DocumentedConfigFlow], session_store=MemorySessionStore(),
                   providers=ProviderRegistry([ScriptedProvider([])]), decision_providers={"typesafe": typesafe})
    engine = FlowEngine(flows=[], session_store=MemorySessionStore(),
                        providers=ProviderRegistry([ScriptedProvider([])]), decision_providers={"typesafe": typesafe})
    with pytest.raises(PicoFlowError, match="DocumentedConfigFlow"):
        engine.register_flow(DocumentedConfigFlow)
    assert engine.get_flow_names() == [] and typesafe.requests == []


def test_use_model_is_refused_at_registration():
    with pytest.raises(PicoFlowError, match="does not call a chat model"):
        IntakeStep(SupportFlow()).use_model(CHAT)


class Args(BaseModel):
    value: int = 0


class DefinesTools(IntakeStep):
    id = "IntakeStep"

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="lookup", description="Look up", schema=Args)]


class UsesTools(IntakeStep):
    id = "IntakeStep"

    def use_tools(self) -> list[str]:
        return ["lookup"]


class DecoratesTools(IntakeStep):
    id = "IntakeStep"

    @tool
    async def lookup(self, args: dict[str, Any]) -> Any:
        return None


class WantsStructuredOutput(IntakeStep):
    id = "IntakeStep"

    def struct_output_schema(self) -> type[BaseModel]:
        return Args


@pytest.mark.parametrize(
    ("step_cls", "feature"),
    [(DefinesTools, "tools"), (UsesTools, "tools"), (DecoratesTools, "tools"),
     (WantsStructuredOutput, "struct_output_schema")],
)
def test_tools_and_structured_output_are_refused_when_steps_are_collected(step_cls: type[Step], feature: str):
    class Refused(Flow):
        def config_model(self) -> ModelSelection:
            return CHAT

        def define_tools(self) -> list[ToolSpec]:
            return [ToolSpec(name="lookup", description="Look up", schema=Args)] if step_cls is not DefinesTools else []

        def define_steps(self) -> list[Step]:
            return [step_cls(self)]

    with pytest.raises(PicoFlowError, match=f"cannot use {feature}.*regular Step"):
        collected(Refused)


def test_a_refused_step_fails_the_registration_before_any_turn():
    class Refused(SupportFlow):
        def define_steps(self) -> list[Step]:
            return [WantsStructuredOutput(self), QuickStep(self)]

    with pytest.raises(PicoFlowError, match="Flow 'Refused' cannot be registered: .*struct_output_schema"):
        decision_engine([Refused], ScriptedDecisionProvider([]))


@pytest.mark.parametrize("questions", [{}, {"q": {"type": "choice"}}, {" ": BLOCKED}, "route"])
async def test_malformed_question_maps_fail_loudly(questions: Any):
    class BadQuestions(IntakeStep):
        id = "IntakeStep"

        def define_questions(self) -> Any:
            return questions

    class BadFlow(SupportFlow):
        def define_steps(self) -> list[Step]:
            return [BadQuestions(self), QuickStep(self), SpecialistStep(self)]

    SupportFlow.flow_fallback = direct_to(QuickStep, "fallback")
    engine, _ = decision_engine([BadFlow], ScriptedDecisionProvider([answers()]))
    response = await engine.run("BadFlow", "Hello")
    assert not response.success and SupportFlow.flow_errors == []


def test_question_contracts_are_checked_on_construction():
    with pytest.raises(ValueError, match="at least two labels"):
        Choice(criteria={"only": "one"})
    with pytest.raises(ValueError, match="at least two levels"):
        Score(criteria=["flat"])
    with pytest.raises(ValueError):
        Noul(criteria={"maybe": "?"})
    assert Noul(criteria={"true": "blocked", "false": "fine"}).type == "noul"


# -- the built-in chat decision provider and usage accounting ----------------------------------------


def estimates(route: tuple[float, float] = (0.2, 0.6), blocked: float = 0.9,
              urgency: tuple[float, float, float] = (0.1, 0.3, 0.6)) -> dict[str, Any]:
    return {
        "content": json.dumps({
            "route": {"quick": route[0], "specialist": route[1]},
            "blocked": {"probability": blocked},
            "urgency": {"0": urgency[0], "1": urgency[1], "2": urgency[2]},
        }),
        "usage": {"input_tokens": 120, "output_tokens": 30},
    }


class ChatDecidedFlow(SupportFlow):
    def config_decision(self) -> dict[str, Any]:
        return {}


async def test_the_chat_provider_derives_answers_from_probabilities_and_tallies_usage_apart():
    engine, chat = scripted_engine([ChatDecidedFlow], [estimates(), text("On it.", 10, 5)])

    response = await engine.run("ChatDecidedFlow", "My cluster is down", config={"tier": "gold"})

    assert (response.success, response.message) == (True, "On it.")
    (received, context), = IntakeStep.seen
    route = received["route"]
    # 0.2 / 0.6 is rescaled to a distribution before the choice is taken.
    assert route.choice == "specialist"
    assert route.probabilities == pytest.approx({"quick": 0.25, "specialist": 0.75})
    assert route.confidence == pytest.approx(0.75)
    assert received["blocked"].noul == 0.9
    urgency = received["urgency"]
    assert urgency.score == pytest.approx(1.5)
    assert (urgency.legend, urgency.confidence) == ("Right now", pytest.approx(0.6))
    assert context.usage is not None and context.usage.total_tokens == 150

    system, human = chat.calls[0]
    assert isinstance(system, SystemMessage) and "Is a production operation blocked?" in system.content
    assert isinstance(human, HumanMessage)
    assert json.loads(human.content) == {"tier": "gold", "open_tickets": [1, 2],
                                         "request": "My cluster is down", "priorRequests": []}
    doc = await stored(engine, response.session)
    assert doc["decisionUsage"]["inputTokens"] == 120 and doc["decisionUsage"]["totalTokens"] == 150
    assert doc["decisionUsage"]["calls"] == 1
    assert (doc["tokens"]["inputTokens"], doc["tokens"]["totalTokens"]) == (10, 15)
    assert response.tokens is not None and response.tokens.total_tokens == 15


async def test_a_rejected_model_decision_is_still_counted():
    SupportFlow.flow_fallback = direct_to(QuickStep, "fallback")
    engine, chat = scripted_engine([ChatDecidedFlow], [{"content": "not json", "usage": {"input_tokens": 7,
                                                                                       "output_tokens": 2}}])

    response = await engine.run("ChatDecidedFlow", "Hello")

    assert (response.success, response.message) == (True, "fallback")
    assert isinstance(SupportFlow.flow_errors[0], DecisionValidationError)
    assert len(chat.calls) == 1
    doc = await stored(engine, response.session)
    assert doc["decisionUsage"]["totalTokens"] == 9 and doc["tokens"]["totalTokens"] == 0
    assert doc["decisionUsage"]["calls"] == 1  # a response rejected by validation is still a call


async def test_usage_a_decision_provider_reports_is_tallied_into_decision_usage_only():
    usage = TokenUsage(input_tokens=11, output_tokens=4, total_tokens=15)
    engine, _ = decision_engine([SupportFlow], ScriptedDecisionProvider([answers()], usage=usage))

    response = await engine.run("SupportFlow", "Hello")

    doc = await stored(engine, response.session)
    assert (doc["decisionUsage"]["inputTokens"], doc["decisionUsage"]["totalTokens"]) == (11, 15)
    assert doc["tokens"]["totalTokens"] == 0


async def test_decision_usage_counts_calls_and_documents_without_the_count_still_load():
    usage = TokenUsage(input_tokens=11, output_tokens=4, total_tokens=15)
    route_only = {"route": answers()["route"]}
    engine, _ = decision_engine([ListeningFlow], ScriptedDecisionProvider([route_only] * 3, usage=usage))
    first = await engine.run("ListeningFlow", "Hello")
    await engine.run("ListeningFlow", "Hello again", first.session)
    doc = await stored(engine, first.session)
    assert (doc["decisionUsage"]["calls"], doc["decisionUsage"]["totalTokens"]) == (2, 30)

    # A document written before calls were counted.
    del doc["decisionUsage"]["calls"]
    await engine.session_store.save(SessionDoc.model_validate(doc), doc["revision"])
    third = await engine.run("ListeningFlow", "And again", first.session)

    assert third.success, third.detail
    doc = await stored(engine, first.session)
    assert (doc["decisionUsage"]["calls"], doc["decisionUsage"]["totalTokens"]) == (1, 45)


async def test_sessions_without_decisions_keep_the_document_unchanged():
    class Plain(Flow):
        def config_model(self) -> ModelSelection:
            return CHAT

        def define_steps(self) -> list[Step]:
            return [QuickStep(self)]

    engine, _ = scripted_engine([Plain], [text("Hello!")])
    response = await engine.run("Plain", "Hi")
    assert "decisionUsage" not in await stored(engine, response.session)


async def test_the_chat_provider_asks_one_probability_per_option():
    chat = ScriptedProvider([estimates()])
    provider = ChatDecisionProvider(ProviderRegistry([chat]))
    request = DecisionRequest(
        step_id="IntakeStep",
        selection=CHAT,
        questions={"route": ROUTE, "blocked": BLOCKED, "urgency": URGENCY},
        state={"request": "Hi", "priorRequests": []},
    )

    result = await provider.decide(request)

    assert set(result.answers) == {"route", "blocked", "urgency"}
    assert result.usage is not None and result.usage.input_tokens == 120


# -- a decision between model steps, in one turn -------------------------------------------------------


class Router(DecisionStep):
    def define_questions(self) -> dict[str, Any]:
        return {"route": ROUTE}

    def get_prompt(self) -> str:
        return "Route the customer's problem."

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        self.save_state({"route": answers["route"].choice, "confidence": answers["route"].confidence})
        return go(SpecialistStep) if answers["route"].choice == "specialist" else go(QuickStep)


class Reception(DeskStep):
    id = "Reception"

    @tool
    async def hand_over(self, args: dict[str, Any]) -> Any:
        return go(Router)


class ChainFlow(Flow):
    def config_model(self) -> ModelSelection:
        return CHAT

    def define_steps(self) -> list[Step]:
        return [
            Reception(self).use_memory("desk"),
            Router(self).use_memory("desk"),
            QuickStep(self).use_memory("desk"),
            SpecialistStep(self).use_memory("desk"),
        ]


async def test_a_decision_step_chained_between_model_steps_in_one_turn():
    route = {"content": json.dumps({"route": {"quick": 0.1, "specialist": 0.9}}),
             "usage": {"input_tokens": 40, "output_tokens": 8}}
    engine, chat = scripted_engine(
        [ChainFlow],
        [text("What is wrong?"), call(("hand_over", {"reason": "outage"})), route, text("Paging the on-call team.")],
    )
    first = await engine.run("ChainFlow", "Hi")
    response = await engine.run("ChainFlow", "Production is down for everyone", first.session)

    assert (response.success, response.message) == (True, "Paging the on-call team.")
    assert len(chat.calls) == 4
    decision_call = chat.calls[2]
    assert json.loads(decision_call[1].content) == {
        "request": "Production is down for everyone",
        "priorRequests": ["Hi"],
    }
    doc = await stored(engine, first.session)
    assert doc["flow"]["currentStep"] == "SpecialistStep"
    assert [item["stepName"] for item in doc["flow"]["sequence"]] == [
        "Reception", "Router", "SpecialistStep"
    ]
    router = next(s for s in doc["flow"]["steps"] if s["name"] == "Router")
    assert router["state"]["route"] == "specialist" and router["state"]["confidence"] == pytest.approx(0.9)
    assert doc["decisionUsage"]["totalTokens"] == 48
    assert doc["tokens"]["totalTokens"] == 45  # three chat calls of 15 tokens each
    # The specialist model sees the whole desk conversation, the hand-over included.
    assert any(getattr(m, "content", "") == "Production is down for everyone" for m in chat.calls[3])


@pytest.mark.parametrize("key", [{"for": "decision"}, {"for": "decision", "step": "Router"}, {"step": "Router"}],
                         ids=["purpose", "purpose-and-step", "step"])
async def test_a_decision_reply_keyed_by_purpose_or_step_answers_the_decision_call(key: dict[str, str]):
    # Scripted last, after the reply the specialist gives in the same turn: only the decision call takes it.
    route = {**key, "content": {"route": {"quick": 0.1, "specialist": 0.9}}}
    engine, chat = scripted_engine(
        [ChainFlow],
        [text("What is wrong?"), call(("hand_over", {"reason": "outage"})), text("Paging the on-call team."), route],
    )
    first = await engine.run("ChainFlow", "Hi")
    response = await engine.run("ChainFlow", "Production is down for everyone", first.session)

    assert (response.success, response.message) == (True, "Paging the on-call team.")
    assert chat.purposes == ["chat", "chat", "decision", "chat"]
    router = next(s for s in (await stored(engine, first.session))["flow"]["steps"] if s["name"] == "Router")
    assert router["state"]["route"] == "specialist"


# -- an error handler that answers from its own step -------------------------------------------------------

HANDOFF = "A support agent will follow up by email."


class Stalled:
    """A decision service that never answers within the step's timeout."""

    def __init__(self) -> None:
        self.requests: list[DecisionRequest] = []

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        self.requests.append(request)
        await asyncio.sleep(5)
        raise AssertionError("the timeout cancels the call first")


class HandoffStep(IntakeStep):
    """Hands off from its error handler and stays where it is, with direct_to itself or direct()."""

    id = "IntakeStep"
    reply: str = "direct_to"

    def config_decision(self) -> dict[str, Any]:
        return {"timeout_ms": 50}

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        IntakeStep.errors.append((error, context))
        if HandoffStep.reply == "direct_to":
            return direct_to(HandoffStep, HANDOFF)
        if HandoffStep.reply == "direct":
            return direct(HANDOFF)
        return None


class HandoffFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [HandoffStep(self), QuickStep(self), SpecialistStep(self)]

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        SupportFlow.flow_errors.append(error)
        return direct_to(HandoffStep, HANDOFF)


def failing_service(kind: str) -> Any:
    if kind == "timeout":
        return Stalled()
    entry = RuntimeError("decision service down") if kind == "failure" else {"route": "quick"}
    return ScriptedDecisionProvider([entry] * 2)


FAILURE_ERRORS = {"timeout": TimeoutError, "failure": RuntimeError, "garbage": DecisionValidationError}


@pytest.mark.parametrize("reply", ["direct_to", "direct", "flow"])
@pytest.mark.parametrize("kind", list(FAILURE_ERRORS))
async def test_an_error_handler_answers_and_keeps_the_cursor_on_its_own_step(kind: str, reply: str):
    HandoffStep.reply = reply
    engine, chat = decision_engine([HandoffFlow], failing_service(kind))

    first = await engine.run("HandoffFlow", "My invoice is wrong")
    second = await engine.run("HandoffFlow", "Still waiting", first.session)

    for response in (first, second):
        assert (response.success, response.completed, response.message) == (True, False, HANDOFF)
    assert second.session == first.session and chat.calls == []
    handled = SupportFlow.flow_errors if reply == "flow" else [error for error, _ in IntakeStep.errors]
    assert [type(error) for error in handled] == [FAILURE_ERRORS[kind]] * 2
    doc = await stored(engine, first.session)
    assert (doc["runStatus"], doc["flow"]["currentStep"]) == ("running", "IntakeStep")
    assert doc["error"] == []
    intake = doc["flow"]["memory"]["IntakeStep"]["messages"]
    assert [message["content"] for message in intake if message["type"] == "ai"] == [HANDOFF] * 2


class FailingHandlerStep(HandoffStep):
    id = "IntakeStep"

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        raise LookupError("no agent on duty")


class FailingHandlerFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [FailingHandlerStep(self), QuickStep(self), SpecialistStep(self)]


@pytest.mark.parametrize("kind", list(FAILURE_ERRORS))
async def test_a_failing_error_handler_leaves_the_decision_error_in_the_log_without_its_text(kind: str, caplog):
    engine, _ = decision_engine([FailingHandlerFlow], failing_service(kind))

    with caplog.at_level("ERROR", logger="picoflow"):
        response = await engine.run("FailingHandlerFlow", "My invoice is wrong")

    assert (response.success, response.error_code) == (False, "TURN_FAILED")
    assert "no agent on duty" in response.detail and "decision service down" not in response.detail
    doc = await stored(engine, response.session)
    logged = next(entry for entry in doc["error"] if entry["message"] == "decision error handler failed")
    assert (logged["step"], logged["decisionErrorType"], logged["handlerErrorType"]) == (
        "IntakeStep", FAILURE_ERRORS[kind].__name__, "LookupError"
    )
    assert doc["error"][-1]["errorType"] == "LookupError"
    (record,) = [r for r in caplog.records if r.getMessage() == "Decision error handler failed"]
    assert record.decisionErrorType == FAILURE_ERRORS[kind].__name__
    assert "decision service down" not in json.dumps(doc["error"])


# -- reading another step's state from a step ----------------------------------------------------------------


class TriageReaderStep(LogicStep):
    """Reads the intake's state from the step, by class, by name, whole and by key, as the original's judge does."""

    async def run_logic(self) -> Any:
        read = {
            "route": self.get_step_state(IntakeStep, "route"),
            "missing": self.get_step_state("IntakeStep", "outcome"),
            "whole": {key: value for key, value in self.get_step_state(IntakeStep).items() if key != "_saveOn"},
        }
        return direct_to(TriageReaderStep, json.dumps(read))


class TriageReadingStep(IntakeStep):
    id = "IntakeStep"

    async def on_decision(self, answers: dict[str, Any], context: DecisionContext) -> Any:
        await super().on_decision(answers, context)
        return go(TriageReaderStep)


class TriageReadingFlow(SupportFlow):
    def define_steps(self) -> list[Step]:
        return [TriageReadingStep(self), TriageReaderStep(self), QuickStep(self), SpecialistStep(self)]


async def test_a_step_reads_another_steps_state_whole_or_by_key():
    engine, _ = decision_engine([TriageReadingFlow], ScriptedDecisionProvider([answers("quick", blocked=0.25)]))

    response = await engine.run("TriageReadingFlow", "Hello")

    assert response.success, response.message
    assert json.loads(response.message) == {
        "route": "quick", "missing": None, "whole": {"route": "quick", "blocked": 0.25},
    }
