"""The events of a streamed turn, and the sink a running turn sends them to.

A turn streamed by ``FlowEngine.stream`` yields, in order: ``delta`` pieces of the user-facing reply as the
model writes them, ``reset`` when the text sent since the last ``reset`` is not the reply after all, optional
``step`` and ``tool`` progress (names only), and exactly one final ``committed`` (after the session write
landed) or ``aborted`` event. The committed message equals the deltas sent after the last ``reset``.

A stream opened with ``tool_details`` (the AG-UI adapter's) also says which call a ``tool`` event is
(``TurnEvent.call``, never part of the JSON), with the validated arguments of the calls the flow shows, and
follows each shown call that ran with a ``tool_result`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage, ToolMessage

from picoflow.messages import content_text
from picoflow.results import RunResponse
from picoflow.wire import PLAIN_TEXT

EventName = Literal["delta", "reset", "step", "tool", "tool_result", "committed", "aborted"]
#: The two events that end a stream; exactly one of them comes last.
FINAL_EVENTS: frozenset[str] = frozenset({"committed", "aborted"})


@dataclass(frozen=True)
class ToolCallView:
    """One tool call as a client that displays tool calls sees it: arguments and result only when shown."""

    #: The model's id of the call.
    id: str
    #: The tool called.
    name: str
    #: The validated arguments when the flow shows this call (``Flow.show_tool_calls``, ``@tool(show=...)``), else
    #: None.
    arguments: dict[str, Any] | None = None
    #: What the model was told the call returned (on ``tool_result`` events only).
    result: str | None = None


@dataclass(frozen=True)
class TurnEvent:
    """One event of a streamed turn: its ``event`` name and its JSON ``data``.

    A final event also carries the turn's ``response`` (what ``FlowEngine.run`` returns); its ``data`` is that
    response's envelope, the same JSON a non-streamed request is answered with.
    """

    event: EventName
    fields: dict[str, Any] = field(default_factory=dict)
    response: RunResponse | None = field(default=None, compare=False, repr=False)
    #: The call a ``tool`` or ``tool_result`` event is about, on streams opened with ``tool_details``; never part
    #: of ``data``.
    call: ToolCallView | None = field(default=None, compare=False, repr=False)

    @property
    def data(self) -> dict[str, Any]:
        """The event's JSON: ``{"text"}`` for a delta, ``{"name"}`` for progress, the envelope for a final event."""
        # Built when read: a drained stream (``FlowEngine.run``) never needs the envelope.
        return self.response.envelope() if self.response is not None else self.fields

    @property
    def final(self) -> bool:
        """Whether this event ends the stream (``committed`` or ``aborted``)."""
        return self.event in FINAL_EVENTS

    @classmethod
    def ending(cls, response: RunResponse) -> TurnEvent:
        """The final event answering ``response``: ``committed`` for a success, else ``aborted``."""
        return cls("committed" if response.success else "aborted", response=response)


class EventSink:
    """Where a running turn sends its events; it remembers the text shown since the last ``reset``.

    Events wait in an unbounded queue: a slow reader never slows the turn down, and the turn never waits
    for a reader that has gone. ``live`` says whether someone reads the reply as it is written; when nobody does
    (``FlowEngine.run``), models are called without streaming and the reply arrives whole before the final event.
    """

    def __init__(self, *, live: bool = True, details: bool = False) -> None:
        self.live = live
        #: Whether tool events carry their calls (``TurnEvent.call``) and shown calls get ``tool_result`` events.
        self.details = details
        self.queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
        #: The reply text sent since the last ``reset``.
        self.shown = ""

    def delta(self, text: str) -> None:
        """Send a piece of the reply."""
        if text:
            self.shown += text
            self.queue.put_nowait(TurnEvent("delta", {"text": text}))

    def reset(self) -> None:
        """Tell the client to discard the text sent since the last reset (nothing is sent when there is none)."""
        if self.shown:
            self.shown = ""
            self.queue.put_nowait(TurnEvent("reset"))

    def progress(self, event: Literal["step", "tool"], name: str) -> None:
        """Say which step runs or which tool is called: a name, never arguments."""
        self.queue.put_nowait(TurnEvent(event, {"name": name}))

    def tools_called(self, calls: Sequence[Mapping[str, Any]], shown: Mapping[str, dict[str, Any]]) -> None:
        """Say which tools the model called, taking back any text it showed first (that was not the reply); with
        ``details``, which call each is, with the validated arguments of those ``shown`` (by call id)."""
        self.reset()
        for call in calls:
            call_id = call.get("id") or ""
            view = ToolCallView(call_id, call["name"], shown.get(call_id) if call_id else None)
            self.queue.put_nowait(TurnEvent("tool", {"name": view.name}, call=view if self.details else None))

    def tools_answered(self, results: Sequence[BaseMessage], shown: Mapping[str, dict[str, Any]]) -> None:
        """Say what each call ``shown`` (by call id) returned, as the tool message the model reads: only with
        ``details``, so a stream that did not ask never carries it."""
        if not self.details:
            return
        for message in results:
            if isinstance(message, ToolMessage) and message.tool_call_id in shown:
                view = ToolCallView(message.tool_call_id, str(message.name or ""), shown[message.tool_call_id],
                                    content_text(message.content))
                self.queue.put_nowait(TurnEvent("tool_result", {"name": view.name}, call=view))

    def finish(self, response: RunResponse) -> None:
        """End the stream with ``response``, first making the deltas since the last reset equal its message.

        A plain-text reply the deltas did not spell out (a direct answer, a reply rewritten by ``on_response``)
        is completed or resent; any other reply arrives whole in the final event, so shown text is reset. The
        stored answer of a turn already applied (``replayed``) comes alone, in the final event, as does every
        answer when nobody reads the turn as it happens.
        """
        if self.live and response.success and not response.replayed:
            message = response.message
            if response.content_type == PLAIN_TEXT and isinstance(message, str):
                if not message.startswith(self.shown):
                    self.reset()
                self.delta(message[len(self.shown):])
            else:
                self.reset()
        self.queue.put_nowait(TurnEvent.ending(response))
