"""The flows as an MCP server: ``POST /mcp`` on ``picoflow serve`` driven by the official ``mcp`` client over
streamable HTTP, one tool per flow with structured output, sessions that only their owner continues, a failed
turn as a tool error with its fixed sentence, and the Lambda handler answering through Mangum."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from picoflow import FlowEngine
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.protocols.mcp_server import build_server, flow_description
from picoflow.stores import MemorySessionStore
from tests.support.browser import ApiServer
from tests.support.echo_flows import EchoFlow, JsonFlow


class DocumentedFlow(EchoFlow):
    """Answers questions about rooms.

    Longer notes that a tool's description leaves out.
    """

    id = "DocumentedFlow"


def engine_with(replies: list[Any]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(replies)
    engine = FlowEngine([EchoFlow, JsonFlow, DocumentedFlow], MemorySessionStore(), ProviderRegistry(override=provider),
                        retry_delay=0)
    return engine, provider


def test_each_flow_is_a_tool_described_by_its_docstring_with_a_structured_answer():
    engine, _ = engine_with([{"content": "Hello!"}, {"content": {"rooms": 3}}])

    async def main() -> None:
        async with Client(build_server(engine, caller=None)) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"EchoFlow", "JsonFlow", "DocumentedFlow"}
            assert tools["DocumentedFlow"].description == "Answers questions about rooms."
            assert tools["EchoFlow"].description == "Talk with the EchoFlow flow."
            assert tools["EchoFlow"].input_schema["required"] == ["message"]
            assert set(tools["EchoFlow"].output_schema["properties"]) == {
                "message", "session", "completed", "pendingApprovals"}
            answer = await client.call_tool("EchoFlow", {"message": "Hi"})
            assert not answer.is_error
            assert answer.structured_content == {**answer.structured_content, "message": "Hello!",
                                                 "completed": False, "pendingApprovals": []}
            json_answer = await client.call_tool("JsonFlow", {"message": "How many?"})
            assert json.loads(json_answer.structured_content["message"]) == {"rooms": 3}

    asyncio.run(main())
    assert flow_description(engine, "NoSuchFlow") == "Talk with the NoSuchFlow flow."


def test_a_session_is_its_owners_and_an_unknown_or_foreign_one_is_an_error():
    engine, provider = engine_with([{"content": "Noted, Ann: room 12."}, {"content": "You are in room 12."}])

    async def main() -> None:
        async with Client(build_server(engine, caller="ann")) as ann:
            first = await ann.call_tool("EchoFlow", {"message": "I am Ann, room 12."})
            session = first.structured_content["session"]
            again = await ann.call_tool("EchoFlow", {"message": "Where am I?", "session": session})
            assert again.structured_content["session"] == session
            assert "room 12" in again.structured_content["message"]
        async with Client(build_server(engine, caller="bob")) as bob:
            for named in (session, "0" * 32):
                refused = await bob.call_tool("EchoFlow", {"message": "Where is Ann?", "session": named})
                assert refused.is_error
                assert refused.content[0].text.endswith("SESSION_NOT_FOUND: No such session.")

    asyncio.run(main())
    assert len(provider.calls) == 2  # Bob's calls never reached a model


def test_a_failed_turn_is_a_tool_error_with_the_fixed_sentence():
    engine, _ = engine_with([{"content": "x", "error": "upstream 400 at https://models.internal", "status": 400}])

    async def main() -> None:
        async with Client(build_server(engine, caller=None)) as client:
            answer = await client.call_tool("EchoFlow", {"message": "Hi"})
            assert answer.is_error
            text = answer.content[0].text
            assert "MODEL_UNAVAILABLE" in text and "models.internal" not in text

    asyncio.run(main())


# -- over streamable HTTP, on picoflow serve ----------------------------------------------------------


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


def test_the_official_mcp_client_converses_with_a_flow_over_streamable_http(serve):
    api = serve([{"content": "The blue room is free."}, {"content": "Booked for Friday."}])

    async def main() -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        async with streamable_http_client(f"{api.url}/mcp") as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            names = [tool.name for tool in (await client.list_tools()).tools]
            first = await client.call_tool("TinyFlow", {"message": "A room?"})
            second = await client.call_tool("TinyFlow", {"message": "Friday.",
                                                         "session": first.structured_content["session"]})
            return names, first.structured_content, second.structured_content

    names, first, second = asyncio.run(main())
    assert names == ["TinyFlow"]
    assert first["message"] == "The blue room is free." and second["message"] == "Booked for Friday."
    assert first["session"] == second["session"]
    stored = api.stored_sessions()[first["session"]]
    assert "Friday." in json.dumps(stored["flow"]["memory"])


# -- through the Lambda handler --------------------------------------------------------------------------


def test_the_lambda_handler_answers_mcp_requests_through_mangum(tmp_path, monkeypatch):
    from picoflow.aws import api

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "Hello Ann."}]))
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setenv("SESSION_STORE", "MEMORY")
    monkeypatch.setenv("PICOFLOW_FLOWS", "tests.support.tiny_flow")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

    def post(message: dict[str, Any], claims: dict[str, str]) -> dict[str, Any]:
        event = http_event("POST", "/mcp", body=message, headers=headers)
        event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
        return api.lambda_handler(event, FakeLambdaContext(timeout_ms=25_000))

    try:
        listed = post({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}, {"sub": "ann"})
        assert listed["statusCode"] == 200, listed
        assert [tool["name"] for tool in json.loads(listed["body"])["result"]["tools"]] == ["TinyFlow"]
        called = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                       "params": {"name": "TinyFlow", "arguments": {"message": "Hi"}}}, {"sub": "ann"})
        result = json.loads(called["body"])["result"]
        session = result["structuredContent"]["session"]
        stored = aws_runtime.get_runtime().call(aws_runtime.get_runtime().engine.session_store.load(session))
        assert stored is not None and stored.owner == "ann"
        foreign = post({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                        "params": {"name": "TinyFlow", "arguments": {"message": "Hi", "session": session}}},
                       {"sub": "bob"})
        assert json.loads(foreign["body"])["result"]["isError"] is True
    finally:
        runtime = aws_runtime._runtime
        if runtime is not None:
            runtime.loop.call_soon_threadsafe(runtime.loop.stop)
