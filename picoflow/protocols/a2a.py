"""Each flow as an A2A agent (``a2a-sdk``): its agent card and its JSON-RPC binding (send and streaming send).

The A2A ``contextId`` is the conversation: its first message creates a session under an id derived from it and
the caller (``picoflow.protocols.conversations``), and later messages of the context continue that session. Each
message runs one turn as one task: ``working``, then ``completed`` with the reply as the task's artifact (and as
the status message), ``input-required`` when tool calls wait for the caller's approval (their list in the status
message's data part; the next message of the context answers them with a data part ``{"approvals": [...]}``), or
``failed`` with the code's fixed sentence. A context whose conversation has ended answers ``failed`` too.

What is left out, and why: tasks live for one request (the session is the durable record, so ``tasks/get``,
resubscription and push notifications are not offered, and a continuation is a new message of the same context,
not of the same task). Each request gets its own SDK request handler, closed once the answer is sent: a task left
``input-required`` would otherwise keep the SDK's producer and consumer waiting on the event loop for a follow-up
that never comes to them, until they are destroyed pending and wedge a later request. Text is not streamed piece
by piece (a turn may take back text it showed, which A2A
artifacts cannot express), so a streaming send carries the task's state changes and the whole reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    Task,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from picoflow.engine import FlowEngine
from picoflow.errors import public_message
from picoflow.protocols.conversations import open_conversation
from picoflow.protocols.mcp_server import flow_description
from picoflow.results import RunResponse, wire_approval

__all__ = ["A2A_PREFIX", "CARD_PATH", "ENDED", "FlowAgent", "TurnRequestHandler", "agent_card", "http_app"]

A2A_PREFIX = "/a2a/"
CARD_PATH = "/.well-known/agent-card.json"
PROTOCOL = "a2a-context"
#: The code and fixed sentence of a message to a context whose conversation has ended.
ENDED = ("CONTEXT_ENDED", "This conversation has ended; start a new context to talk again.")
BEARER = "bearer"

# Closing a request's handler while its task waits for input closes the task's event queues under their dispatcher,
# which the SDK reports as a warning that events may be lost: none are, the task has nothing more to say. Its
# errors still show.
logging.getLogger("a2a.server.events.event_queue_v2").setLevel(logging.ERROR)

T = TypeVar("T")
Submit = Callable[[Coroutine[Any, Any, T]], Awaitable[T]]


async def _here(coroutine: Coroutine[Any, Any, T]) -> T:
    return await coroutine


def agent_card(engine: FlowEngine, flow_name: str, base_url: str, *, bearer: bool) -> AgentCard:
    """The agent card of ``flow_name`` served at ``base_url`` (``.../a2a/<flow>``); ``bearer`` when the API
    requires a JWT bearer token (the template's authorizer), which the card then declares."""
    description = flow_description(engine, flow_name)
    card = AgentCard(
        name=flow_name,
        description=description,
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=base_url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id=flow_name, name=flow_name, description=description, tags=["conversation"])],
    )
    if bearer:
        card.security_schemes[BEARER].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", bearer_format="JWT", description="A JWT from the API's issuer, in Authorization.")))
        card.security_requirements.append(SecurityRequirement(schemes={BEARER: StringList(list=[])}))
    return card


class FlowAgent(AgentExecutor):
    """Runs one turn of a flow per A2A message, for one caller."""

    def __init__(self, engine: FlowEngine, flow_name: str, *, caller: str | None, submit: Submit[Any] = _here,
                 deadline: float | None = None, request_id: str | None = None) -> None:
        self.engine = engine
        self.flow_name = flow_name
        self.caller = caller
        self.submit = submit
        self.deadline = deadline
        self.request_id = request_id

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """One turn: the message's text (and approvals) in, the task's state and the reply out."""
        message = context.message
        assert message is not None
        task = context.current_task or new_task_from_user_message(message)
        if context.current_task is None:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        conversation = await self.submit(open_conversation(self.engine, PROTOCOL, task.context_id, self.caller,
                                                           message.message_id))
        if conversation.ended:
            await updater.failed(self._say(updater, *ENDED))
            return
        approvals = _approvals(message)
        extra: dict[str, Any] = {"approvals": approvals} if approvals else {}
        # Shielded: a turn ends on its own, even when the request's handler is closed while it runs (a send that
        # asked to return at once).
        response: RunResponse = await asyncio.shield(self.submit(self.engine.run(
            self.flow_name, context.get_user_input() or None, conversation.session_id, deadline=self.deadline,
            idempotency_key=conversation.key, caller=self.caller, request_id=self.request_id, **extra,
        )))
        if not response.success:
            await updater.failed(self._say(updater, response.error_code or "TURN_FAILED", str(response.message)))
            return
        text = response.message if isinstance(response.message, str) else json.dumps(response.message)
        if response.pending_approvals:
            pending = [wire_approval(item) for item in response.pending_approvals]
            parts = [Part(text=text), _data_part({"pendingApprovals": pending})]
            await updater.requires_input(updater.new_agent_message(parts))
            return
        await updater.add_artifact([Part(text=text, media_type=response.content_type)], name="reply")
        await updater.complete(updater.new_agent_message([Part(text=text)],
                                                         metadata={"completed": response.completed}))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """A turn is all or nothing and ends on its own: cancelling one is not offered."""
        raise NotImplementedError("A turn cannot be cancelled; it ends by itself.")

    @staticmethod
    def _say(updater: TaskUpdater, code: str, sentence: str) -> Any:
        return updater.new_agent_message([Part(text=sentence or public_message(code))], metadata={"code": code})


class TurnRequestHandler(DefaultRequestHandler):
    """The SDK's request handler, answering a send only once its turn has ended: a task lasts one request, so a
    client's ``returnImmediately`` would leave the turn to a handler that is closed when the answer is sent."""

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        """A send, answered with the task where its turn left it."""
        params.configuration.return_immediately = False
        answer: Message | Task = await super().on_message_send(params, context)
        return answer


def http_app(engine: FlowEngine, flow_name: str, base_url: str, *, bearer: bool, caller: str | None,
             submit: Submit[Any] = _here, deadline: float | None = None, request_id: str | None = None) -> ASGIApp:
    """The agent's routes: the card at ``/a2a/<flow>/.well-known/agent-card.json`` and JSON-RPC at ``/a2a/<flow>``.

    Every request is answered by a request handler of its own, closed when the answer has been sent, so no task
    of the SDK outlives the request that started it.
    """
    card = agent_card(engine, flow_name, base_url, bearer=bearer)
    path = f"{A2A_PREFIX}{flow_name}"

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        executor = FlowAgent(engine, flow_name, caller=caller, submit=submit, deadline=deadline,
                             request_id=request_id)
        handler = TurnRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
        routes = [*create_agent_card_routes(card, card_url=f"{path}{CARD_PATH}"),
                  *create_jsonrpc_routes(handler, rpc_url=path)]
        try:
            await Starlette(routes=routes)(scope, receive, send)
        finally:
            await handler.aclose()

    return answer


def _approvals(message: Any) -> list[dict[str, Any]]:
    """The decisions in a message's data parts: ``{"approvals": [{"id", "approved", "reason"?}]}``."""
    found: list[dict[str, Any]] = []
    for part in message.parts:
        if not part.HasField("data"):
            continue
        data = MessageToDict(part.data)
        for item in data.get("approvals") or () if isinstance(data, Mapping) else ():
            if isinstance(item, Mapping) and isinstance(item.get("id"), str) and isinstance(item.get("approved"),
                                                                                          bool):
                decision = {"id": item["id"], "approved": item["approved"]}
                if isinstance(item.get("reason"), str):
                    decision["reason"] = item["reason"]
                found.append(decision)
    return found


def _data_part(data: dict[str, Any]) -> Part:
    value = struct_pb2.Value()
    value.struct_value.update(json.loads(json.dumps(data, default=str)))
    return Part(data=value)
