"""The bundled RefundFlow, whose refund waits for the customer's approval, driven on ``picoflow serve`` through each
open protocol's interrupt form with a client nobody on the project wrote: AG-UI's ``HttpAgent`` (``RUN_FINISHED``
outcome ``interrupt``, then ``resume``), the official MCP client (``pendingApprovals``, then ``approvals``), and the
a2a-sdk client (task ``input-required``, then a data part with the decisions)."""

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
from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from picoflow.protocols.a2a import _data_part
from tests.support.agui_node import run_http_agent
from tests.support.browser import ApiServer

CONVERSATION = json.loads((Path(__file__).resolve().parents[1] / "flows/refunds/conversation.json").read_text())
#: The three customer turns up to the refund that waits for approval.
ASKING = CONVERSATION["turns"][:3]
REPLIES = [reply for turn in ASKING for reply in turn["replies"]]
ISSUED = "89.00 USD for the Wireless headphones has been issued"
#: How many refund conversations the A2A test holds on one server, and how long any one request may take there.
A2A_CONVERSATIONS = 3
A2A_REQUEST_SECONDS = 20


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[], ApiServer]]:
    servers: list[ApiServer] = []

    def start(conversations: int = 1) -> ApiServer:
        server = ApiServer(tmp_path / f"api{len(servers)}", REPLIES * conversations, None, flows="flows.refunds")
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


def test_a2a_asks_for_input_and_takes_the_decision_in_a_data_part(serve):
    # Several conversations on one server, by send and by streaming send: a task left input-required must not
    # outlive its request and wedge a later one. Every request has a deadline, so a regression fails, never hangs.
    api = serve(A2A_CONVERSATIONS)
    base = f"{api.url}/a2a/RefundFlow"

    async def send(parts: list[Part], context_id: str | None, streaming: bool) -> Task:
        async with httpx.AsyncClient(timeout=A2A_REQUEST_SECONDS) as http:
            client = await create_client(base, client_config=ClientConfig(httpx_client=http, streaming=streaming))
            message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=parts)
            if context_id:
                message.context_id = context_id
            events: list[StreamResponse] = [event async for event in client.send_message(
                SendMessageRequest(message=message))]
        task = next(event.task for event in events if event.HasField("task"))
        updates = [event.status_update for event in events if event.HasField("status_update")]
        if updates:
            # A streaming send: the task first, then its state changes; the last one is where it ended.
            task.status.CopyFrom(updates[-1].status)
        return task

    async def conversation(streaming: bool) -> tuple[Task, Task]:
        context = None
        for turn in ASKING:
            task = await send([Part(text=turn["user"])], context, streaming)
            context = task.context_id
        data = MessageToDict(task.status.message.parts[1].data)
        decision = _data_part({"approvals": [{"id": item["id"], "approved": True}
                                             for item in data["pendingApprovals"]]})
        return task, await send([decision], context, streaming)

    async def main() -> list[tuple[Task, Task]]:
        return [await conversation(streaming=bool(number % 2)) for number in range(A2A_CONVERSATIONS)]

    for asked, decided in asyncio.run(main()):
        assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        [pending] = MessageToDict(asked.status.message.parts[1].data)["pendingApprovals"]
        assert pending["tool"] == "refund_item" and pending["arguments"] == {"sku": "HP-200", "reason": "defective"}
        assert decided.context_id == asked.context_id
        assert decided.status.state == TaskState.TASK_STATE_COMPLETED
        assert ISSUED in decided.status.message.parts[0].text
    assert "was destroyed but it is pending" not in api.output()
