"""A streamed model call: the reply's text goes to the turn's event sink as the model writes it.

Only the executing top-level step's plain-text replies stream; nested children, parallel workers and structured
output answer as a whole. The loop decides what the reply is; this module only shows it early, and takes back
(``reset``) what turns out not to be the reply: text before a tool call, or a partial answer whose call failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage, message_chunk_to_message

from picoflow.authoring.run_context import execution_frames, worker_view
from picoflow.authoring.step import Step
from picoflow.events import EventSink, ToolCallView
from picoflow.messages import content_text, finish_reason
from picoflow.wire import PLAIN_TEXT


class IncompleteReplyError(ConnectionError):
    """A streamed reply ended without the provider saying why: its connection was cut (an idle timeout, a proxy
    closing a close-delimited body), so the text is a fragment. A connection failure, hence retried."""


class StalledReplyError(TimeoutError):
    """A streamed reply sent no chunk for the call policy's ``stall_ms``."""


def turn_sink(flow: Any) -> EventSink | None:
    """The sink of the streamed turn ``flow`` runs, unless this task runs a nested child or a parallel worker."""
    sink: EventSink | None = flow.run_context.events
    if sink is None or execution_frames(flow) or worker_view(flow) is not None:
        return None
    return sink


def reply_sink(flow: Any, step: Step) -> EventSink | None:
    """Where ``step``'s model call streams its text: only a top-level step replying in plain text streams."""
    return turn_sink(flow) if step.content_type == PLAIN_TEXT else None


def announce_step(flow: Any, step: Step) -> None:
    """Tell a streaming client that the turn moved to ``step``."""
    sink = turn_sink(flow)
    if sink is not None:
        sink.progress("step", step.id)


def announce_tools(flow: Any, ai: AIMessage, shown: Mapping[str, dict[str, Any]]) -> None:
    """Tell a streaming client which tools the model called: any text it showed was not the reply.

    ``shown`` holds the validated arguments of the calls the flow shows, by call id; other calls go by name.
    """
    sink = turn_sink(flow)
    if sink is not None:
        sink.reset()
        for call in ai.tool_calls:
            call_id = call.get("id") or ""
            sink.tool_called(ToolCallView(call_id, call["name"], shown.get(call_id) if call_id else None))


def announce_results(flow: Any, results: Sequence[BaseMessage], shown: Mapping[str, dict[str, Any]]) -> None:
    """Tell a streaming client what each shown call returned: the tool message the model reads."""
    sink = turn_sink(flow)
    if sink is None:
        return
    for message in results:
        if isinstance(message, ToolMessage) and message.tool_call_id in shown:
            sink.tool_answered(ToolCallView(message.tool_call_id, str(message.name or ""),
                                            shown[message.tool_call_id], content_text(message.content)))


async def streamed_call(
    runnable: Any, request: list[BaseMessage], sink: EventSink, stall: float | None = None
) -> AIMessage:
    """One model call through LangChain's ``astream``, its text sent to ``sink`` piece by piece.

    The chunks are merged into the message ``ainvoke`` would have returned (usage, finish reason and tool calls
    included). Each chunk must come within ``stall`` seconds (``StalledReplyError``), and the reply must end with
    the provider's finish reason (``IncompleteReplyError``): both count as a failed call. A call that fails
    part-way takes back what it showed.
    """
    # A new call's text replaces whatever an earlier call of this turn showed.
    sink.reset()
    chunks: list[AIMessageChunk] = []
    calling = False
    stream = aiter(runnable.astream(request))
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(anext(stream), stall)
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                raise StalledReplyError(f"no chunk of the reply for {stall:g} s") from exc
            chunks.append(chunk)
            # Once the model turns to a tool, its words so far were not the reply, nor are any that follow.
            calling = calling or bool(chunk.tool_call_chunks)
            if calling:
                sink.reset()
            else:
                sink.delta(content_text(chunk.content))
        if not chunks:
            raise IncompleteReplyError("the reply's stream ended before its first chunk")
        # Merged once at the end: merging chunk by chunk would copy the growing message at every chunk.
        merged = message_chunk_to_message(chunks[0] + chunks[1:] if len(chunks) > 1 else chunks[0])
        if finish_reason(merged.response_metadata) is None:
            raise IncompleteReplyError("the reply's stream ended without a finish reason")
    except BaseException:
        sink.reset()
        raise
    finally:
        closing = getattr(stream, "aclose", None)
        if closing is not None:
            await closing()
    return merged if isinstance(merged, AIMessage) else AIMessage(content=merged.content,
                                                                  response_metadata=merged.response_metadata)
