"""Each flow as an A2A agent: the a2a-sdk client resolves a flow's agent card on ``picoflow serve``, sends a
message, continues the same context (the same session), streams a send, and sees a failed turn as a ``failed``
task with the fixed sentence; the card declares the bearer scheme the API enforces; a foreign caller's context
never reaches another's conversation."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import Message, Part, Role, SendMessageConfiguration, SendMessageRequest, StreamResponse, TaskState

from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.protocols import a2a
from picoflow.stores import MemorySessionStore
from tests.support.browser import ApiServer
from tests.support.echo_flows import EchoFlow


def user_message(text: str, context_id: str | None = None, data: dict[str, Any] | None = None) -> Message:
    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return message


async def send(base_url: str, message: Message, *, streaming: bool = False,
               http: httpx.AsyncClient | None = None) -> list[StreamResponse]:
    async with (http or httpx.AsyncClient(timeout=30)) as client_http:
        client = await create_client(base_url, client_config=ClientConfig(httpx_client=client_http,
                                                                          streaming=streaming))
        return [event async for event in client.send_message(SendMessageRequest(message=message))]


def final_task(events: list[StreamResponse]) -> Any:
    tasks = [event.task for event in events if event.HasField("task")]
    updates = [event.status_update for event in events if event.HasField("status_update")]
    if updates:
        return updates[-1]
    return tasks[-1]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[list[Any]], ApiServer]]:
    servers: list[ApiServer] = []

    def start(replies: list[Any]) -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", replies, None)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_the_a2a_client_resolves_the_card_sends_and_continues_the_same_context(serve):
    api = serve([{"content": "The blue room is free."}, {"content": "Booked for Friday."}])
    base = f"{api.url}/a2a/TinyFlow"
    card = httpx.get(f"{base}/.well-known/agent-card.json", timeout=10).json()
    assert card["name"] == "TinyFlow" and card["supportedInterfaces"][0]["url"] == base
    assert card["capabilities"]["streaming"] is True and "securitySchemes" not in card

    first = asyncio.run(send(base, user_message("A room?")))
    task = first[-1].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.status.message.parts[0].text == "The blue room is free."
    assert task.artifacts[0].parts[0].text == "The blue room is free."

    second = asyncio.run(send(base, user_message("Friday.", task.context_id), streaming=True))
    states = [event.status_update.status.state for event in second if event.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED and TaskState.TASK_STATE_WORKING in states
    reply = [event.artifact_update.artifact for event in second if event.HasField("artifact_update")]
    assert reply[0].parts[0].text == "Booked for Friday."
    [stored] = api.stored_sessions().values()
    memory = json.dumps(stored["flow"]["memory"])
    assert "A room?" in memory and "Friday." in memory and stored["revision"] == 2


def test_a_failed_turn_is_a_failed_task_with_the_fixed_sentence(serve):
    api = serve([{"content": "x", "error": "upstream 400 at https://models.internal", "status": 400}])
    events = asyncio.run(send(f"{api.url}/a2a/TinyFlow", user_message("Hi")))
    status = events[-1].task.status
    assert status.state == TaskState.TASK_STATE_FAILED
    assert status.message.metadata["code"] == "MODEL_UNAVAILABLE"
    assert "models.internal" not in str(events)


def test_an_unknown_agent_is_not_found(serve):
    api = serve([])
    answer = httpx.get(f"{api.url}/a2a/NoSuchFlow/.well-known/agent-card.json", timeout=10)
    assert answer.status_code == 404 and answer.json()["code"] == "NOT_FOUND"


# -- in process: the card's security, callers, approvals ------------------------------------------------


def engine_with(replies: list[Any]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(replies)
    engine = FlowEngine([EchoFlow], MemorySessionStore(), ProviderRegistry(override=provider), retry_delay=0)
    return engine, provider


def asgi(engine: FlowEngine, caller: str | None, *, bearer: bool = False) -> httpx.AsyncClient:
    app = a2a.http_app(engine, "EchoFlow", "http://agent/a2a/EchoFlow", bearer=bearer, caller=caller)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")


def test_the_card_declares_the_bearer_jwt_the_api_requires():
    engine, _ = engine_with([])
    card = a2a.agent_card(engine, "EchoFlow", "https://api.example/a2a/EchoFlow", bearer=True)
    assert card.security_schemes["bearer"].http_auth_security_scheme.bearer_format == "JWT"
    assert list(card.security_requirements[0].schemes) == ["bearer"]
    assert card.skills[0].id == "EchoFlow"


def test_another_callers_message_in_the_same_context_never_reaches_the_conversation():
    engine, provider = engine_with([{"content": "Noted, Ann."}, {"content": "Hello, stranger."}])
    base = "http://agent/a2a/EchoFlow"
    first = asyncio.run(send(base, user_message("I am Ann, room 12."), http=asgi(engine, "ann")))
    context = first[-1].task.context_id
    asyncio.run(send(base, user_message("Who am I?", context), http=asgi(engine, "bob")))
    assert not any("room 12" in str(message.content) for message in provider.calls[-1])


def test_an_ended_context_is_a_failed_task_in_its_own_words():
    engine, _ = engine_with([{"content": "Bye."}])
    base = "http://agent/a2a/EchoFlow"
    context = asyncio.run(send(base, user_message("Hi"), http=asgi(engine, None)))[-1].task.context_id
    from picoflow.protocols.conversations import conversation_session

    doc = asyncio.run(engine.session_store.load(conversation_session(a2a.PROTOCOL, context, None)))
    assert doc is not None
    doc.run_status = "completed"
    asyncio.run(engine.session_store.save(doc, doc.revision))
    status = asyncio.run(send(base, user_message("Again", context), http=asgi(engine, None)))[-1].task.status
    assert status.state == TaskState.TASK_STATE_FAILED
    assert status.message.parts[0].text == a2a.ENDED[1]


def test_a_send_asking_to_return_at_once_is_answered_when_its_turn_has_ended():
    # A task lasts one request: answered at once, its turn would be left to a request handler already closed.
    engine, _ = engine_with([{"content": "The blue room is free.", "delay": 0.2}])

    async def main() -> Any:
        async with asgi(engine, None) as http:
            client = await create_client("http://agent/a2a/EchoFlow",
                                         client_config=ClientConfig(httpx_client=http, streaming=False))
            request = SendMessageRequest(message=user_message("A room?"),
                                         configuration=SendMessageConfiguration(return_immediately=True))
            return [event async for event in client.send_message(request)][-1].task

    task = asyncio.run(main())
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.status.message.parts[0].text == "The blue room is free."


def test_approval_decisions_are_read_from_a_data_part():
    message = user_message("")
    message.parts.append(a2a._data_part({"approvals": [{"id": "ap-1", "approved": True},
                                                       {"id": "ap-2", "approved": False, "reason": "no"},
                                                       {"id": 3, "approved": True}]}))
    assert a2a._approvals(message) == [{"id": "ap-1", "approved": True},
                                       {"id": "ap-2", "approved": False, "reason": "no"}]
