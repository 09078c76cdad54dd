"""BasicFlow end to end: the scripted conversation through the Lambda handler on moto DynamoDB.

Every turn is checked against the persisted document (cursor, step state, sequence, memory) and against
what the scripted model actually received, not only against the reply text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

import flows.basic
import handlers.api as api
from flows.basic import IDLE_EXPIRY_MS, BasicFlow
from flows.basic.common import ABRUPT_END, ADDRESS_END, parse_json_object
from flows.basic.concurrent import ConcurStep4
from flows.basic.validators import InvalidInput, check_birth_date, check_full_name, parse_address
from picoflow import FlowEngine
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.messages import message_step
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import DynamoDBSessionStore, MemorySessionStore, SessionDoc

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

CONVERSATION = json.loads((Path(flows.basic.__file__).parent / "conversation.json").read_text(encoding="utf-8"))
TURNS = CONVERSATION["turns"]
# The persisted cursor after each turn of conversation.json.
EXPECTED_STEPS = [
    "WeatherStep",
    "WeatherStep",
    "FavoritesStep",
    "NameStep",
    "NameStep",
    "DOBStep",
    "DOBStep",
    "AddressStep",
    "AddressStep",
    "TerminateSessionStep",
]
# The parallel workers of the "John Wick" turn, in the order their calls are made. Their scripted
# replies are identical, so whichever worker asks first, every worker gets the same answer.
WORKERS = ["ConcurStep1", "ConcurStep2", "ConcurStep3", "ConcurStep4"]
WORKER_TASKS = {
    "ConcurStep1": "run the first follow-up task",
    "ConcurStep2": "run the second follow-up task",
    "ConcurStep3": "double-check what ConcurStep1 reported",
    "ConcurStep4": "prepare the ground for ConcurStep2",
}
# The nested part of the sequence one run_step(InContextStep) adds: levels 2 to 4, each parallel branch
# followed by the worker it nested, in request order (not in completion order).
NESTED_SEQUENCE = [
    (2, "InContextStep"),
    (3, "ConcurStep1"),
    (4, "ConcurStep3"),
    (3, "ConcurStep2"),
    (4, "ConcurStep4"),
]
PRESIDENT_REPLY = {
    "content": "Abraham Lincoln, who led the Union through the Civil War.",
    "usage": {"input_tokens": 41, "output_tokens": 13},
}


def _turn_index(user: str) -> int:
    return next(i for i, turn in enumerate(TURNS) if turn["user"] == user)


class BasicFlowClient:
    """Drives BasicFlow through ``handlers.api.lambda_handler`` with API Gateway v2 events."""

    def __init__(self, table: Any) -> None:
        self.store = DynamoDBSessionStore(table.name, client=table.client)
        self.session: str | None = None

    def send(self, message: str | None, config: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"flowName": "BasicFlow", "config": config}
        if message is not None:
            body["message"] = message
        headers = {"CHAT_SESSION_ID": self.session} if self.session else None
        result = api.lambda_handler(http_event("POST", "/ai/run", body=body, headers=headers), FakeLambdaContext())
        assert result["statusCode"] == 200, result["body"]
        reply = json.loads(result["body"])
        if self.session:
            # A changed id would mean the session was silently recreated.
            assert reply["session"] == self.session
        self.session = reply["session"]
        return reply

    def doc(self) -> SessionDoc:
        doc = asyncio.run(self.store.load(self.session))
        assert doc is not None
        return doc

    @property
    def model(self) -> ScriptedProvider:
        return aws_runtime.get_engine().providers.override


@pytest.fixture
def basic_client(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Callable[[list[dict]], BasicFlowClient]]:
    def start(replies: list[dict]) -> BasicFlowClient:
        script = tmp_path / "script.json"
        script.write_text(json.dumps(replies), encoding="utf-8")
        monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
        monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
        monkeypatch.setenv("PICOFLOW_FLOWS", "flows.basic")
        monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
        for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(aws_runtime, "_runtime", None)
        return BasicFlowClient(moto_dynamodb)

    yield start
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def _state(doc: SessionDoc, step: str) -> dict[str, Any]:
    return next(s.state for s in doc.flow.steps if s.name == step)


def _sequence(doc: SessionDoc) -> list[tuple[int, str]]:
    return [(item.level, item.step_name) for item in doc.flow.sequence]


def _tool_results(messages: list[BaseMessage]) -> list[str]:
    """The tool results the model was just handed: the run of tool messages closing its request."""
    results: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        results.insert(0, str(message.content))
    return results


def _public(state: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in state.items() if key != "_saveOn"}


def _worker(call: list[BaseMessage]) -> str | None:
    """The step that made a model call, read from the id of the message closing its request."""
    return message_step(call[-1])


def _owners(doc: SessionDoc, namespace: str) -> set[str]:
    """The steps that wrote the (non-system) messages of one namespace."""
    return {m.id.split("|", 1)[0] for m in doc.flow.memory[namespace].messages if m.type != "system"}


def test_scripted_conversation_walks_basic_flow_to_completion(basic_client):
    client = basic_client([reply for turn in TURNS for reply in turn["replies"]])
    model_calls: list[list[list[BaseMessage]]] = []
    docs: list[SessionDoc] = []
    replies: list[dict[str, Any]] = []

    for index, turn in enumerate(TURNS):
        before = len(client.model.calls)
        reply = client.send(turn["user"], CONVERSATION["config"])
        calls = client.model.calls[before:]
        doc = client.doc()
        label = f"turn {index + 1} ({turn['user']!r})"
        assert reply["success"] is True, label
        assert reply["message"] == turn["replies"][-1]["content"], label
        assert len(calls) == len(turn["replies"]), f"{label}: model calls"
        assert doc.flow.current_step == EXPECTED_STEPS[index], label
        # One conditional write per turn.
        assert doc.revision == index + 1, label
        assert reply["completed"] is (index == len(TURNS) - 1), label
        model_calls.append(calls)
        docs.append(doc)
        replies.append(reply)

    # Unsupported cities: the group handler's stay() feedback reaches the model as both tool results.
    turn = _turn_index("PDX,PHX")
    feedback = _tool_results(model_calls[turn][1])
    assert len(feedback) == 2
    assert all("PDX and PHX are not supported" in text and "LA and NYC" in text for text in feedback)
    assert not any(key.startswith("city_") for key in _state(docs[turn], "WeatherStep"))

    # Both cities in one reply: one backend lookup, then two logic steps without any model call.
    turn = _turn_index("LA,NYC")
    doc = docs[turn]
    assert _state(doc, "WeatherStep")["city_LA"] == 72
    assert _state(doc, "WeatherStep")["city_NYC"] == 83
    assert _sequence(doc) == [
        (1, "WeatherStep"),
        (1, "FooLogicStep"),
        (1, "GooLogicStep"),
        (1, "FavoritesStep"),
    ]
    # with_state() lands on the destination, never on the logic step that returned it.
    assert _state(doc, "GooLogicStep")["fooData"] == "fooValue"
    assert _state(doc, "FavoritesStep")["gooData"] == "gooValue"
    assert "fooData" not in _state(doc, "FooLogicStep")
    favorites_call = model_calls[turn][1]
    assert "three favourites" in favorites_call[0].content
    assert '"favoriteColor"' in favorites_call[0].content  # the schema file filled the placeholder
    assert isinstance(favorites_call[-1], HumanMessage) and favorites_call[-1].content == "Hi"

    # Response-driven routing: the JSON answer is parsed in on_response and saved.
    turn = _turn_index("blue, Star Wars, summer")
    assert _state(docs[turn], "FavoritesStep")["favorites"] == {
        "favoriteColor": "blue",
        "favoriteMovie": "Star Wars",
        "favoriteSeason": "summer",
    }

    # A placeholder name is refused in code; the refusal reaches the model as the tool result.
    turn = _turn_index("John Doe")
    assert _tool_results(model_calls[turn][1]) == [
        "Cannot accept John Doe: it is a placeholder, not a real name. Tell the user and ask for a different full name."
    ]
    assert "name" not in _state(docs[turn], "NameStep")

    # The real name: InContextStep runs nested (structured output) after fanning out to four parallel
    # workers; the cursor goes straight to DOBStep.
    turn = _turn_index("John Wick")
    doc = docs[turn]
    name_state = _state(doc, "NameStep")
    assert name_state["name"] == "John Wick"
    assert name_state["runData"] == {"channel": "offline-demo"}
    assert name_state["inContext"]["title"] == "Orbit Academy"
    in_context = _state(doc, "InContextStep")
    assert in_context["movieIdea"]["releaseYear"] == 2030
    assert "_transient" not in in_context
    assert _sequence(doc)[-7:] == [(1, "NameStep"), *NESTED_SEQUENCE, (1, "DOBStep")]
    user_name_call, *worker_calls, movie_call, dob_call = model_calls[turn]
    by_worker = {_worker(call): call for call in worker_calls}
    assert sorted(by_worker) == WORKERS and len(worker_calls) == 4
    order = [_worker(call) for call in worker_calls]
    # ConcurStep1 nests from on_response (after its own call), ConcurStep2 from on_enter (before it).
    assert order.index("ConcurStep1") < order.index("ConcurStep3")
    assert order.index("ConcurStep4") < order.index("ConcurStep2")
    follow_up = TURNS[turn]["replies"][1]["content"]
    for name, call in by_worker.items():
        # Each worker starts from its own prompt and message: no share of any other history.
        assert [m.type for m in call] == ["system", "human"], name
        assert f"You are {name}," in call[0].content and WORKER_TASKS[name] in call[0].content, name
        assert WORKER_TASKS[name] in call[1].content, name
        assert not any("John Wick" in str(m.content) for m in call), name
    # The child run from on_enter answered before ConcurStep2's prompt was rendered.
    assert f"already reported: {follow_up}" in by_worker["ConcurStep2"][0].content
    # What the workers published: each its own slot, and the parents' view of their children's outputs.
    for name in WORKERS:
        worker_state = _state(doc, name)
        assert (worker_state["task"], worker_state["confirmation"]) == (WORKER_TASKS[name], follow_up), name
    assert _state(doc, "ConcurStep1")["followUp"] == {"ConcurStep3": {"output": follow_up}}
    assert _state(doc, "ConcurStep2")["prerequisite"] == {"ConcurStep4": {"output": follow_up}}
    assert in_context["followUps"] == {
        "ConcurStep1": {"output": follow_up},
        "ConcurStep2": {"output": follow_up},
    }
    # No child ever held the cursor, and every worker's state was written in this turn only.
    assert not set(WORKERS) & set(EXPECTED_STEPS)
    assert all(_public(_state(docs[turn - 1], name)) == {} for name in WORKERS)
    # The transient argument reached the child's prompt during the request.
    assert "passed by NameStep for this request only" in movie_call[0].content
    assert [m.type for m in movie_call] == ["system", "human"]
    # Cross-step state: the DOB prompt names the user collected by NameStep.
    assert "Ask for the date of birth of John Wick." in dob_call[0].content
    # Shared "default" history: DOBStep's model sees the name exchange NameStep had.
    assert any(isinstance(m, HumanMessage) and m.content == "John Wick" for m in dob_call)
    dob_selection = client.model.selections[sum(len(t["replies"]) for t in TURNS[: turn + 1]) - 1]
    assert (dob_selection.name, dob_selection.params) == ("gpt-5.1", {"reasoning": {"effort": "low"}})

    turn = _turn_index("2/31/2000")
    assert _tool_results(model_calls[turn][1]) == [
        "2/31/2000 is not a real calendar date. Ask for a valid date of birth in M/D/YYYY format."
    ]
    assert "year" not in _state(docs[turn], "DOBStep")

    turn = _turn_index("1/1/2000")
    dob = _state(docs[turn], "DOBStep")
    assert (dob["year"], dob["month"], dob["day"]) == (2000, 1, 1)

    turn = _turn_index("123 Main Street")
    assert _tool_results(model_calls[turn][1])[0].startswith("The address must contain a street")
    assert "address" not in _state(docs[turn], "AddressStep")

    # The last turn: the parsed address is stored, and the closing prompt and state land on the terminal step.
    doc = docs[-1]
    assert replies[-1]["completed"] is True
    assert doc.run_status == "completed"
    assert _state(doc, "AddressStep")["address"] == {
        "street": "123 K St.",
        "city": "Portland",
        "state": "OR",
        "zip": "97006",
    }
    terminal = _state(doc, "TerminateSessionStep")
    assert terminal["_prompt"] == ADDRESS_END
    assert terminal["closedBy"] == "AddressStep"
    assert model_calls[-1][1][0].content == ADDRESS_END
    assert _sequence(doc) == [
        (1, "WeatherStep"),
        (1, "FooLogicStep"),
        (1, "GooLogicStep"),
        (1, "FavoritesStep"),
        (1, "NameStep"),
        *NESTED_SEQUENCE,
        (1, "DOBStep"),
        (1, "AddressStep"),
        (1, "TerminateSessionStep"),
    ]

    # Shared and isolated namespaces. run_steps() workers talk to the model on private copies of memory
    # that picoflow discards at the join, so ConcurStep1..4 leave no namespace behind (the original keeps
    # one per worker); their results live in their state and their parents'.
    assert set(doc.flow.memory) == {"WeatherStep", "default", "favorite", "separate", "temp"}
    assert not any(_owners(doc, namespace) & set(WORKERS) for namespace in doc.flow.memory)
    assert _owners(doc, "default") == {"FooLogicStep", "GooLogicStep", "NameStep", "DOBStep", "AddressStep"}
    assert _owners(doc, "favorite") == {"FavoritesStep"}
    assert _owners(doc, "separate") == {"InContextStep"}
    assert _owners(doc, "temp") == {"TerminateSessionStep"}
    assert _owners(doc, "WeatherStep") == {"WeatherStep"}
    assert not any(m.content == "John Wick" for m in movie_call)

    # Tokens: the sum of every scripted usage record, the parallel workers' calls included.
    usages = [reply["usage"] for turn in TURNS for reply in turn["replies"]]
    tokens = doc.tokens
    assert tokens.input_tokens == sum(u["input_tokens"] for u in usages)
    assert tokens.output_tokens == sum(u["output_tokens"] for u in usages)
    assert tokens.total_tokens == tokens.input_tokens + tokens.output_tokens
    reasoning = sum(u.get("output_token_details", {}).get("reasoning", 0) for u in usages)
    assert tokens.reasoning_tokens == reasoning
    assert tokens.visible_output_tokens == tokens.output_tokens - reasoning
    assert client.model.remaining == 0
    assert doc.error == [] and doc.warn == []


def test_is_president_config_starts_at_president_step(basic_client):
    client = basic_client([PRESIDENT_REPLY])
    reply = client.send(None, {"isPresident": True, "nth": "16th"})

    assert reply["success"] is True
    assert reply["completed"] is True
    assert reply["message"] == PRESIDENT_REPLY["content"]
    doc = client.doc()
    assert doc.run_status == "completed"
    assert doc.flow.current_step == "PresidentStep"
    assert _sequence(doc) == [(1, "PresidentStep")]
    assert _state(doc, "PresidentStep")["who"] == PRESIDENT_REPLY["content"]
    assert _state(doc, "WeatherStep") == {}
    assert set(doc.flow.memory) == {"president"}
    (call,) = client.model.calls
    assert call[-1].content == "Who was the 16th President of the United States?"
    assert doc.tokens.input_tokens == 41 and doc.tokens.output_tokens == 13


# -- smaller paths, on the engine directly -----------------------------------------------------------


def _engine(replies: list[dict[str, Any]]) -> tuple[FlowEngine, ScriptedProvider]:
    model = ScriptedProvider(replies)
    engine = FlowEngine(
        flows=[BasicFlow],
        session_store=MemorySessionStore(),
        providers=ProviderRegistry(override=model),
        retry_delay=0,
    )
    return engine, model


def _text(content: str) -> dict[str, Any]:
    return {"content": content}


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "args": args} for name, args in calls]}


async def test_one_city_per_turn_is_kept_until_the_other_arrives():
    engine, model = _engine(
        [
            _text("Which cities?"),
            _calls(("get_weather", {"city": "los angeles"})),
            _text("Got LA. And the other one?"),
            _calls(("get_weather", {"city": "New York City"})),
            _text("Now your favourites, please."),
        ]
    )
    first = await engine.run("BasicFlow", "Hi")
    second = await engine.run("BasicFlow", "Los Angeles", first.session)
    doc = await engine.session_store.load(first.session)
    assert doc.flow.current_step == "WeatherStep"
    assert _state(doc, "WeatherStep")["city_LA"] == 72
    assert _tool_results(model.calls[2]) == ["LA accepted. Ask the user for NYC."]

    third = await engine.run("BasicFlow", "New York City", second.session)
    doc = await engine.session_store.load(first.session)
    assert third.message == "Now your favourites, please."
    assert doc.flow.current_step == "FavoritesStep"
    assert _state(doc, "WeatherStep")["city_NYC"] == 83


async def test_terminate_session_tool_ends_the_conversation_from_a_collection_step():
    engine, model = _engine(
        [
            _text("Which cities?"),
            _calls(("terminate_session", {"prompt": "bye"})),
            _text("Understood, goodbye!"),
        ]
    )
    first = await engine.run("BasicFlow", "Hi")
    last = await engine.run("BasicFlow", "Stop, I want to leave", first.session)
    doc = await engine.session_store.load(first.session)
    assert last.completed is True
    assert doc.flow.current_step == "TerminateSessionStep"
    assert model.calls[-1][0].content == ABRUPT_END
    assert set(model.tools[1]) == {"terminate_session", "get_weather"}


async def test_favorites_prose_keeps_the_step_and_bad_json_is_not_saved():
    engine, model = _engine(
        [
            _calls(("get_weather", {"city": "LA"}), ("get_weather", {"city": "NYC"})),
            _text("Tell me your favourite colour, movie and season."),
            _text("Which season do you like best?"),
            _text('{"favoriteColor": "green", "favoriteMovie": "Alien", "favoriteSeason": "winter"}'),
        ]
    )
    first = await engine.run("BasicFlow", "LA and NYC")
    second = await engine.run("BasicFlow", "red and Alien", first.session)
    third = await engine.run("BasicFlow", "green, Alien, winter", first.session)
    doc = await engine.session_store.load(first.session)
    assert second.message == "Which season do you like best?"
    assert third.success is True
    assert doc.flow.current_step == "FavoritesStep"
    assert "favorites" not in _state(doc, "FavoritesStep")


async def test_a_failed_worker_is_recorded_and_the_name_turn_still_completes(monkeypatch):
    async def backend_down(self: ConcurStep4, user_message: str | None = None) -> str:
        raise RuntimeError("the preparatory backend is down")

    monkeypatch.setattr(ConcurStep4, "run", backend_down)
    turn = _turn_index("John Wick")
    # ConcurStep4 never reaches the model, so the turn needs one follow-up reply fewer.
    name_turn = TURNS[turn]["replies"]
    engine, model = _engine([*(r for t in TURNS[:turn] for r in t["replies"]), name_turn[0], *name_turn[2:]])
    session = None
    for earlier in TURNS[:turn]:
        session = (await engine.run("BasicFlow", earlier["user"], session, config=CONVERSATION["config"])).session
    before = len(model.calls)

    response = await engine.run("BasicFlow", "John Wick", session, config=CONVERSATION["config"])
    assert response.success is True
    assert response.message == name_turn[-1]["content"]
    doc = await engine.session_store.load(session)
    assert doc.flow.current_step == "DOBStep"
    assert model.remaining == 0
    worker_calls = {_worker(call): call for call in model.calls[before + 1 : -2]}
    assert sorted(worker_calls) == ["ConcurStep1", "ConcurStep2", "ConcurStep3"]
    # The rejected branch is reported to its parent, which carries on without it.
    assert _state(doc, "ConcurStep2")["prerequisite"] == {
        "ConcurStep4": {"error": "RuntimeError: the preparatory backend is down"}
    }
    assert "went ahead without it" in worker_calls["ConcurStep2"][0].content
    assert _public(_state(doc, "ConcurStep4")) == {}
    follow_up = name_turn[1]["content"]
    assert _state(doc, "InContextStep")["followUps"] == {
        "ConcurStep1": {"output": follow_up},
        "ConcurStep2": {"output": follow_up},
    }
    assert _state(doc, "NameStep")["inContext"]["title"] == "Orbit Academy"
    # A branch that started is traced even when it failed.
    assert _sequence(doc)[-7:] == [(1, "NameStep"), *NESTED_SEQUENCE, (1, "DOBStep")]


async def test_idle_sessions_start_over():
    flow = BasicFlow()
    fresh = SessionDoc(id="recent", flow={"name": "BasicFlow"})
    stale = SessionDoc(
        id="stale",
        flow={"name": "BasicFlow"},
        save_on=datetime.now(UTC) - timedelta(milliseconds=IDLE_EXPIRY_MS + 60_000),
    )
    assert await flow.on_restore_session_doc(fresh) is fresh
    assert await flow.on_restore_session_doc(stale) is None


# -- validators and helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123 K St. Portland, OR 97006", ("123 K St.", "Portland", "OR", "97006")),
        ("12 Main St, Springfield, il 62701-1234", ("12 Main St", "Springfield", "IL", "62701-1234")),
        ("  7  Ocean   Avenue Santa Monica,  CA 90401 ", ("7 Ocean Avenue", "Santa Monica", "CA", "90401")),
    ],
)
def test_parse_address_splits_the_parts(text, expected):
    address = parse_address(text)
    assert (address.street, address.city, address.state, address.zip) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("123 Main Street", "must contain a street"),
        ("Main St, Springfield, IL 62701", "house number"),
        ("1 Elm Rd Townsville, ZZ 12345", "'ZZ' is not a U.S. state"),
        ("1 Elm St, 42, IL 12345", "does not look like a city"),
    ],
)
def test_parse_address_explains_refusals(text, reason):
    with pytest.raises(InvalidInput, match=reason):
        parse_address(text)


def test_birth_date_and_name_rules():
    assert check_birth_date(2000, 1, 1) == date(2000, 1, 1)
    with pytest.raises(InvalidInput, match="not a real calendar date"):
        check_birth_date(2001, 2, 29)
    with pytest.raises(InvalidInput, match="in the future"):
        check_birth_date(2030, 1, 1, today=date(2026, 1, 1))
    assert check_full_name("  John   Wick ") == "John Wick"
    for placeholder in ("John Doe", "jane DOE"):
        with pytest.raises(InvalidInput, match="placeholder"):
            check_full_name(placeholder)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ("[1, 2]", None),
        ("Which season?", None),
    ],
)
def test_parse_json_object(text, expected):
    assert parse_json_object(text) == expected
