"""The bundled RefundFlow, whose refund waits for the customer's approval, driven on ``picoflow serve`` through each
open protocol's interrupt form with a client nobody on the project wrote: AG-UI's ``HttpAgent`` (``RUN_FINISHED``
outcome ``interrupt``, then ``resume``), the official MCP client (``pendingApprovals``, then ``approvals``), and the
a2a-sdk client (task ``input-required``, then a data part with the decisions) on the A2A routes in process."""

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
from a2a.types import Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from flows.refunds import RefundFlow
from picoflow import FlowEngine
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.protocols.a2a import _data_part, http_app
from tests.support.agui_node import run_http_agent
from tests.support.browser import ApiServer

CONVERSATION = json.loads((Path(__file__).resolve().parents[1] / "flows/refunds/conversation.json").read_text())
#: The three customer turns up to the refund that waits for approval.
ASKING = CONVERSATION["turns"][:3]
REPLIES = [reply for turn in ASKING for reply in turn["replies"]]
ISSUED = "89.00 USD for the Wireless headphones has been issued"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[], ApiServer]]:
    servers: list[ApiServer] = []

    def start() -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", REPLIES, None, flows="flows.refunds")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_ag_ui_interrupts_and_resumes_the_refund(serve):
    api = serve()
    runs: list[dict[str, Any]] = [{"message": turn["user"]} for turn in ASKING] + [{"resumeAll": {"approved": True}}]
    seen = run_http_agent(f"{api.url}/ag-ui/RefundFlow", f"thread-{uuid.uuid4()}", runs)
    asked, resumed = seen[2], seen[3]
    assert asked["outcome"] == "interrupt"
    [interrupt] = asked["interrupts"]
    assert interrupt["reason"] == "tool_approval" and interrupt["metadata"]["tool"] == "refund_item"
    assert interrupt["metadata"]["arguments"] == {"sku": "HP-200", "reason": "defective"}
    assert resumed["error"] is None and resumed["outcome"] == "success"
    assert ISSUED in resumed["messages"][-1]["content"]


def test_mcp_returns_pending_approvals_and_takes_the_decision(serve):
    api = serve()

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with streamable_http_client(f"{api.url}/mcp") as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            session = None
            for turn in ASKING:
                answer = await client.call_tool("RefundFlow", {"message": turn["user"],
                                                               **({"session": session} if session else {})})
                session = answer.structured_content["session"]
            asked = answer.structured_content
            approvals = [{"id": item["id"], "approved": True} for item in asked["pendingApprovals"]]
            decided = await client.call_tool("RefundFlow", {"message": "", "session": session,
                                                            "approvals": approvals})
            return asked, decided.structured_content

    asked, decided = asyncio.run(main())
    [pending] = asked["pendingApprovals"]
    assert pending["tool"] == "refund_item" and pending["approver"] == "user" and pending["expiresAt"]
    assert ISSUED in decided["message"] and decided["pendingApprovals"] == []


def test_a2a_asks_for_input_and_takes_the_decision_in_a_data_part():
    # In process (the SDK's routes over httpx's ASGI transport): the same client and JSON-RPC, one event loop.
    engine = FlowEngine([RefundFlow], providers=ProviderRegistry(override=ScriptedProvider(REPLIES)), retry_delay=0)
    app = http_app(engine, "RefundFlow", "http://agent/a2a/RefundFlow", bearer=False, caller=None)
    base = "http://agent/a2a/RefundFlow"

    async def send(parts: list[Part], context_id: str | None) -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent",
                                     timeout=30) as http:
            client = await create_client(base, client_config=ClientConfig(httpx_client=http, streaming=False))
            message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=parts)
            if context_id:
                message.context_id = context_id
            return [event async for event in client.send_message(SendMessageRequest(message=message))][-1].task

    async def main() -> tuple[Any, Any]:
        context = None
        for turn in ASKING:
            task = await send([Part(text=turn["user"])], context)
            context = task.context_id
        asked = task
        data = MessageToDict(asked.status.message.parts[1].data)
        decision = _data_part({"approvals": [{"id": item["id"], "approved": True}
                                             for item in data["pendingApprovals"]]})
        return asked, await send([decision], context)

    asked, decided = asyncio.run(main())
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert decided.status.state == TaskState.TASK_STATE_COMPLETED
    assert ISSUED in decided.status.message.parts[0].text
