"""A local Anthropic Messages API server for tests: scripted replies, recorded requests, and optionally
Anthropic's prompt-caching rule applied to the token usage it reports."""

from __future__ import annotations

import json
from typing import Any

from tests.support.fake_openai import FakeOpenAIServer, reply_tokens, text_pieces
from tests.support.prompt_cache import MAX_POINTS, BlockPrefixCache, anthropic_blocks, too_many_points

MESSAGES_PATH = "/v1/messages"


def anthropic_message(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    model: str = "claude-sonnet-4-5",
) -> dict[str, Any]:
    """A Messages API response body; each tool call is ``{"id", "name", "args"}``."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in tool_calls or []]
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": "tool_use" if tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 0, "output_tokens": 0},
    }


class FakeAnthropicServer(FakeOpenAIServer):
    """Serves POST /v1/messages from ``responses`` in order (see ``FakeOpenAIServer``); with a ``cache``
    (a ``BlockPrefixCache``), each reply reports the uncached input tokens and the cache reads and writes as
    ``input_tokens``, ``cache_read_input_tokens`` and ``cache_creation_input_tokens``; a request with too many
    cache points gets the API's 400."""

    path = MESSAGES_PATH

    def __init__(self, responses: list[dict[str, Any] | tuple[Any, ...]], *,
                 cache: BlockPrefixCache | None = None, chunk_delay: float = 0.0) -> None:
        super().__init__(responses, cache=cache, chunk_delay=chunk_delay)

    def stream_events(self, body: dict[str, Any], payload: dict[str, Any]) -> list[str]:
        """The Messages API's server-sent events for ``payload``: text word by word, tool input as JSON deltas."""
        usage = payload["usage"]
        start = {**payload, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        for index, block in enumerate(payload["content"]):
            if block["type"] == "text":
                events.append({"type": "content_block_start", "index": index,
                               "content_block": {"type": "text", "text": ""}})
                events += [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
                           for p in text_pieces(block["text"])]
            else:
                events.append({"type": "content_block_start", "index": index,
                               "content_block": {**block, "input": {}}})
                events.append({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            events.append({"type": "content_block_stop", "index": index})
        # As the API does today, the closing delta reports the whole usage (input and cache counts included).
        events.append({"type": "message_delta", "delta": {"stop_reason": payload["stop_reason"], "stop_sequence": None},
                       "usage": usage})
        events.append({"type": "message_stop"})
        return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events]

    def _problems(self, body: dict[str, Any]) -> list[str]:
        points = sum(b.point for b in anthropic_blocks(body))
        return [too_many_points(points)] if points > MAX_POINTS else []

    def _with_usage(self, body: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
        usage = self.cache.request(anthropic_blocks(body))
        text = "".join(b["text"] for b in payload["content"] if b["type"] == "text")
        calls = [{"name": b["name"], "args": b["input"]} for b in payload["content"] if b["type"] == "tool_use"]
        return {**payload, "usage": {
            "input_tokens": usage.uncached,
            "cache_read_input_tokens": usage.cache_read,
            "cache_creation_input_tokens": usage.cache_write,
            "output_tokens": reply_tokens(text, calls),
        }}
