"""AG-UI 1.0 over a flow: a ``RunAgentInput`` runs one turn, whose events become an AG-UI event stream.

The thread is the session. A thread's first run creates its session under an id derived from the ``threadId`` and
the caller (``thread_session``), so every later run of the thread finds it; another caller's run of the same
``threadId`` derives another id, never this conversation. The server keeps the history: of the client's
``messages`` only the last one, when it is the user's, is taken as the turn's message, and ``resume`` entries
answer pending approvals. Nothing the client sends replaces or rewrites the stored conversation.

Turn events map to AG-UI events (``AguiTranslator``): ``step`` to ``STEP_STARTED``/``STEP_FINISHED``, ``delta`` to
``TEXT_MESSAGE_START``/``CONTENT``, ``reset`` to ``TEXT_MESSAGE_END`` marked ``discarded`` in its metadata, ``tool``
to ``TOOL_CALL_START``/``END`` with ``TOOL_CALL_ARGS`` between them for a call the flow shows (``Flow.show_tool_calls``,
``@tool(show=...)``), ``tool_result`` to ``TOOL_CALL_RESULT``, ``committed`` to ``STATE_SNAPSHOT``
(``state_snapshot``), ``MESSAGES_SNAPSHOT`` and
``RUN_FINISHED`` (outcome ``interrupt`` while approvals are pending), ``aborted`` to ``RUN_ERROR`` with the code's
fixed sentence.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    Interrupt,
    Message,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

from picoflow.engine import FlowEngine
from picoflow.events import TurnEvent
from picoflow.protocols.conversations import conversation_key, conversation_session, open_conversation
from picoflow.session.document import SessionDoc
from picoflow.wire import PLAIN_TEXT

__all__ = [
    "EVENT_STREAM", "THREAD_ENDED", "AguiTranslator", "approvals_from", "encode", "new_user_message", "read_input",
    "run_events", "state_snapshot", "thread_key", "thread_session",
]

EVENT_STREAM = EventEncoder().get_content_type()
#: The code and fixed sentence of a run on a thread whose conversation has ended (completed or aborted).
THREAD_ENDED = ("THREAD_ENDED", "This conversation has ended; start a new thread to talk again.")
#: The interrupt ``reason`` of a tool call waiting for the user's approval.
APPROVAL_REASON = "tool_approval"
# What a resume entry's payload must look like to answer an approval.
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}

_ENCODER = EventEncoder()


def encode(event: BaseEvent) -> str:
    """One event as a server-sent event frame (``data: {json}`` and a blank line), as AG-UI clients read it,
    stamped with the time it is encoded (milliseconds since the epoch) unless it has a timestamp already."""
    if event.timestamp is None:
        event = event.model_copy(update={"timestamp": int(time.time() * 1000)})
    return _ENCODER.encode(event)


def state_snapshot(doc: SessionDoc | None) -> dict[str, Any]:
    """What a client is shown of a session: its current step and that step's state, without private keys.

    Keys starting with ``_`` (the framework's ``_prompt``, ``_saveOn``, a flow's own private ones) stay on the
    server, as does every other step's state, the context and the memory.
    """
    if doc is None:
        return {"step": None, "state": {}}
    step = doc.flow.current_step
    state = next((item.state for item in doc.flow.steps if item.name == step), {})
    return {"step": step, "state": {key: value for key, value in state.items() if not key.startswith("_")}}


def read_input(body: Any) -> RunAgentInput:
    """The ``RunAgentInput`` of a request body (camelCase JSON); pydantic's ``ValidationError`` when it is not one."""
    return RunAgentInput.model_validate(body)


def new_user_message(run: RunAgentInput) -> str | None:
    """The turn's message: the text of the client's last message when that is the user's, else None.

    Earlier messages are the client's copy of a history the server already holds: they are never read.
    """
    if not run.messages or run.messages[-1].role != "user":
        return None
    content = run.messages[-1].content
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content) or None


def approvals_from(run: RunAgentInput) -> list[dict[str, Any]]:
    """The user's decisions in ``resume``: ``[{"id", "approved", "reason"?}]`` (a cancelled interrupt is a denial)."""
    decisions: list[dict[str, Any]] = []
    for entry in run.resume or ():
        payload = entry.payload if isinstance(entry.payload, Mapping) else {}
        approved = entry.status == "resolved" and payload.get("approved", True) is True
        decision: dict[str, Any] = {"id": entry.interrupt_id, "approved": approved}
        if isinstance(payload.get("reason"), str):
            decision["reason"] = payload["reason"]
        decisions.append(decision)
    return decisions


PROTOCOL = "ag-ui-thread"


def thread_key(thread_id: str) -> str:
    """The idempotency key of a thread's first run: the session it creates is ``thread_session``'s id."""
    return conversation_key(PROTOCOL, thread_id)


def thread_session(thread_id: str, caller: str | None) -> str:
    """The id of the session that holds ``thread_id``'s conversation for ``caller``."""
    return conversation_session(PROTOCOL, thread_id, caller)


class AguiTranslator:
    """Turns one run's turn events into AG-UI events, keeping the open step, message and tool call ids in order.

    ``messages`` is the client's history as it sent it: the run's ``MESSAGES_SNAPSHOT`` is that history with the
    committed reply after it, so discarded text leaves the client's view too.
    """

    def __init__(self, run: RunAgentInput) -> None:
        self.thread_id = run.thread_id
        self.run_id = run.run_id
        self.history: list[Message] = list(run.messages)
        self._count = 0
        self._step: str | None = None
        self._message: str | None = None
        #: The reply shown since the last discard, and the id of the message that carried it.
        self._shown = ""
        self._shown_id: str | None = None
        #: This run's id of each tool call, by the model's call id.
        self._calls: dict[str, str] = {}
        #: The ``STATE_SNAPSHOT`` of the run's end (``state_snapshot`` of the committed session).
        self.snapshot: dict[str, Any] = {"step": None, "state": {}}

    def _id(self, kind: str) -> str:
        self._count += 1
        return f"{self.run_id}-{kind}{self._count}"

    def started(self) -> list[BaseEvent]:
        """The run's first event."""
        return [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id)]

    def translate(self, event: TurnEvent) -> list[BaseEvent]:
        """The AG-UI events for one turn event (a final one ends the run)."""
        if event.event == "delta":
            return self._text(str(event.data.get("text") or ""))
        if event.event == "reset":
            self._shown, self._shown_id = "", None
            return self._end_message(discarded=True)
        if event.event == "step":
            return [*self._end_message(), *self._end_step(), *self._start_step(str(event.data.get("name")))]
        if event.event == "tool":
            return [*self._end_message(), *self._tool_call(event)]
        if event.event == "tool_result":
            return self._tool_result(event)
        assert event.response is not None
        response = event.response
        if not response.success:
            closing = self._end_message(discarded=True)
            return [*closing, RunErrorEvent(message=str(response.message), code=response.error_code)]
        return self._finished(event)

    def _tool_call(self, event: TurnEvent) -> list[BaseEvent]:
        call_id = self._id("t")
        name = str(event.data.get("name"))
        events: list[BaseEvent] = [ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name)]
        call = event.call
        if call is not None and call.id:
            self._calls[call.id] = call_id
            # Only a call the flow shows carries its arguments; any other is told by name.
            if call.arguments is not None:
                events.append(ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(call.arguments)))
        events.append(ToolCallEndEvent(tool_call_id=call_id))
        return events

    def _tool_result(self, event: TurnEvent) -> list[BaseEvent]:
        call = event.call
        call_id = self._calls.get(call.id) if call is not None else None
        if call is None or call_id is None or call.arguments is None or call.result is None:
            return []
        return [ToolCallResultEvent(message_id=self._id("r"), tool_call_id=call_id, content=call.result, role="tool")]

    def _text(self, text: str) -> list[BaseEvent]:
        if not text:
            return []
        events: list[BaseEvent] = []
        if self._message is None:
            self._message = self._shown_id = self._id("m")
            events.append(TextMessageStartEvent(message_id=self._message, role="assistant"))
        self._shown += text
        events.append(TextMessageContentEvent(message_id=self._message, delta=text))
        return events

    def _end_message(self, *, discarded: bool = False) -> list[BaseEvent]:
        if self._message is None:
            return []
        message, self._message = self._message, None
        return [TextMessageEndEvent(message_id=message, metadata={"discarded": True} if discarded else None)]

    def _start_step(self, name: str) -> list[BaseEvent]:
        self._step = name
        return [StepStartedEvent(step_name=name)]

    def _end_step(self) -> list[BaseEvent]:
        if self._step is None:
            return []
        step, self._step = self._step, None
        return [StepFinishedEvent(step_name=step)]

    def _finished(self, event: TurnEvent) -> list[BaseEvent]:
        response = event.response
        assert response is not None
        events: list[BaseEvent] = []
        text = response.message if isinstance(response.message, str) else json.dumps(response.message)
        if response.content_type != PLAIN_TEXT or text != self._shown:
            # A reply that did not stream (JSON, a replayed turn) arrives whole, as one message.
            events += self._end_message(discarded=bool(self._shown))
            self._shown, self._shown_id = "", None
            events += self._text(text)
        reply_id = self._shown_id
        events += self._end_message()
        events += self._end_step()
        if reply_id is not None:
            self.history.append(AssistantMessage(id=reply_id, role="assistant", content=text))
        events.append(StateSnapshotEvent(snapshot={**self.snapshot, "completed": response.completed}))
        events.append(MessagesSnapshotEvent(messages=self.history))
        pending = response.pending_approvals
        if pending:
            outcome: Any = RunFinishedInterruptOutcome(type="interrupt", interrupts=[_interrupt(p) for p in pending])
        else:
            outcome = RunFinishedSuccessOutcome(type="success")
        events.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome,
                                       result={"completed": response.completed}))
        return events


def _interrupt(pending: Mapping[str, Any]) -> Interrupt:
    """An approval waiting for the user, as an AG-UI interrupt the next run answers with ``resume``."""
    tool = str(pending.get("tool") or "")
    expires = pending.get("expires_at")
    return Interrupt(
        id=str(pending.get("id")), reason=APPROVAL_REASON, message=f"Approve the call of {tool}?",
        response_schema=APPROVAL_SCHEMA, expires_at=str(expires) if expires else None,
        metadata={"tool": tool, "arguments": pending.get("arguments"), "step": pending.get("step"),
                  "approver": pending.get("approver")},
    )


async def run_events(
    engine: FlowEngine,
    flow_name: str,
    run: RunAgentInput,
    *,
    caller: str | None,
    deadline: float | None = None,
    request_id: str | None = None,
    message: str | None = None,
) -> AsyncIterator[BaseEvent]:
    """Run one turn of ``flow_name`` for ``run`` and yield its AG-UI events as they happen.

    ``message`` is the turn's message when the adapter has read (and checked) it already; by default it is
    ``new_user_message(run)``.
    """
    translator = AguiTranslator(run)
    for started in translator.started():
        yield started
    # A retried run (the same runId) is answered from its receipt; a thread's first run creates its session.
    conversation = await open_conversation(engine, PROTOCOL, run.thread_id, caller, run.run_id)
    if conversation.ended:
        code, sentence = THREAD_ENDED
        yield RunErrorEvent(message=sentence, code=code)
        return
    approvals = approvals_from(run)
    extra: dict[str, Any] = {"approvals": approvals} if approvals else {}
    text = message if message is not None else new_user_message(run)
    turn = engine.stream(
        flow_name, text, conversation.session_id, config=_config(run), deadline=deadline,
        idempotency_key=conversation.key, caller=caller, request_id=request_id, tool_details=True, **extra,
    )
    async for event in turn:
        if event.event == "committed" and event.response is not None and event.response.session:
            # One more read, after the write: the state shown is the one committed.
            translator.snapshot = state_snapshot(await engine.session_store.load(event.response.session))
        for translated in translator.translate(event):
            yield translated


def _config(run: RunAgentInput) -> dict[str, Any] | None:
    """The session configuration a thread's first run may pass in ``forwardedProps.config``."""
    props = run.forwarded_props if isinstance(run.forwarded_props, Mapping) else {}
    config = props.get("config")
    return dict(config) if isinstance(config, Mapping) else None
