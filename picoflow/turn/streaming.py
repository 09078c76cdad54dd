"""A streamed model call: the reply's text goes to the turn's event sink as the model writes it.

Only the executing top-level step's plain-text replies stream (a hop holds the sink only then:
``picoflow.turn.hop``); nested children, parallel workers and structured output answer as a whole. The loop
decides what the reply is; this module only shows it early, and takes back (``reset``) what turns out not to be
the reply: text before a tool call, or a partial answer whose call failed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, message_chunk_to_message

from picoflow.events import EventSink
from picoflow.messages import content_text, finish_reason


class IncompleteReplyError(ConnectionError):
    """A streamed reply ended without the provider saying why: its connection was cut (an idle timeout, a proxy
    closing a close-delimited body), so the text is a fragment. A connection failure, hence retried."""


class StalledReplyError(TimeoutError):
    """A streamed reply sent no chunk for the call policy's ``stall_ms``."""


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
