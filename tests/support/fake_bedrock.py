"""Bedrock's Converse API answered inside botocore, for tests: scripted replies, recorded requests, and
optionally Bedrock's prompt-caching rule applied to the token usage it reports.

``FakeBedrock.attach(chat_model)`` registers ``before-send`` handlers on the model's boto3 client (botocore's
public event system): the signed request never leaves the process, and the handler's response is parsed by
botocore as the service's own. ConverseStream is answered in the binary event-stream framing botocore reads.
"""

from __future__ import annotations

import binascii
import json
import struct
from typing import Any

from botocore.awsrequest import AWSResponse

from tests.support.fake_openai import reply_tokens, text_pieces
from tests.support.prompt_cache import BlockPrefixCache, bedrock_blocks


def converse_response(*, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Converse response body without usage; each tool call is ``{"id", "name", "args"}``."""
    blocks: list[dict[str, Any]] = [{"text": content}] if content else []
    blocks += [{"toolUse": {"toolUseId": c["id"], "name": c["name"], "input": c["args"]}} for c in tool_calls or []]
    return {
        "output": {"message": {"role": "assistant", "content": blocks}},
        "stopReason": "tool_use" if tool_calls else "end_turn",
        "metrics": {"latencyMs": 1},
    }


def event_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    """One message of the AWS event-stream encoding: prelude, its CRC, string headers, JSON payload, CRC."""
    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")):
        encoded = value.encode()
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(encoded)) + encoded
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + headers + body
    return message + struct.pack(">I", binascii.crc32(message))


def converse_stream_frames(payload: dict[str, Any], *, ended: bool = True) -> bytes:
    """A Converse response as ConverseStream's events: text word by word, tool input whole, usage last; not
    ``ended``, the stream stops before ``messageStop`` (as a cut connection would)."""
    frames = [event_frame("messageStart", {"role": "assistant"})]
    for index, block in enumerate(payload["output"]["message"]["content"]):
        if "text" in block:
            frames += [event_frame("contentBlockDelta", {"delta": {"text": piece}, "contentBlockIndex": index})
                       for piece in text_pieces(block["text"])]
        else:
            use = block["toolUse"]
            start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
            frames.append(event_frame("contentBlockStart", {"start": start, "contentBlockIndex": index}))
            frames.append(event_frame("contentBlockDelta", {"delta": {"toolUse": {"input": json.dumps(use["input"])}},
                                                            "contentBlockIndex": index}))
        frames.append(event_frame("contentBlockStop", {"contentBlockIndex": index}))
    if ended:
        frames.append(event_frame("messageStop", {"stopReason": payload["stopReason"]}))
        frames.append(event_frame("metadata", {"usage": payload["usage"], "metrics": payload["metrics"]}))
    return b"".join(frames)


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Any:
        yield self.data

    def close(self) -> None:
        """Nothing to release: the body is in memory."""


class FakeBedrock:
    """Answers Converse requests from ``responses`` (bodies, or functions of the request) in order.

    ``requests`` holds the parsed bodies, ``sizes`` their sizes in bytes and ``usages`` the usage reported. With
    a ``cache`` (a ``BlockPrefixCache``), usage reports the uncached input tokens and the cache reads and writes
    as ``inputTokens``, ``cacheReadInputTokens`` and ``cacheWriteInputTokens``.
    """

    def __init__(self, responses: list[Any], *, cache: BlockPrefixCache | None = None, cut: int = 0) -> None:
        self._responses = list(responses)
        #: How many of the first streamed answers stop before their end.
        self.cut = cut
        self.cache = cache
        self.requests: list[dict[str, Any]] = []
        self.sizes: list[int] = []
        self.usages: list[dict[str, Any]] = []

    def attach(self, chat_model: Any) -> Any:
        """Serve ``chat_model``'s Converse and ConverseStream calls (a ``ChatBedrockConverse``); returns it."""
        chat_model.client.meta.events.register("before-send.bedrock-runtime.Converse", self._send)
        chat_model.client.meta.events.register("before-send.bedrock-runtime.ConverseStream", self._send_stream)
        return chat_model

    def _send_stream(self, request: Any, **_: Any) -> AWSResponse:
        answer = self._send(request)
        if answer.status_code != 200:
            return answer
        payload = json.loads(answer.raw.data)
        headers = {"Content-Type": "application/vnd.amazon.eventstream"}
        ended = self.cut <= 0
        self.cut -= 1
        return AWSResponse(request.url, 200, headers, _Raw(converse_stream_frames(payload, ended=ended)))

    def _send(self, request: Any, **_: Any) -> AWSResponse:
        data = request.body if isinstance(request.body, bytes) else (request.body or b"").encode()
        body = json.loads(data)
        self.requests.append(body)
        self.sizes.append(len(data))
        if not self._responses:
            error = {"message": "the fake Bedrock has no response left"}
            return AWSResponse(request.url, 500, {"x-amzn-ErrorType": "InternalServerException"},
                               _Raw(json.dumps(error).encode()))
        response = self._responses.pop(0)
        payload = dict(response(body) if callable(response) else response)
        usage = self.cache.request(bedrock_blocks(body)) if self.cache is not None else None
        blocks = payload["output"]["message"]["content"]
        text = "".join(b.get("text", "") for b in blocks)
        calls = [{"name": b["toolUse"]["name"], "args": b["toolUse"]["input"]} for b in blocks if "toolUse" in b]
        output = reply_tokens(text, calls)
        uncached = usage.uncached if usage else 0
        payload["usage"] = {
            "inputTokens": uncached,
            "outputTokens": output,
            "totalTokens": (usage.input_tokens if usage else 0) + output,
            "cacheReadInputTokens": usage.cache_read if usage else 0,
            "cacheWriteInputTokens": usage.cache_write if usage else 0,
        }
        self.usages.append(payload["usage"])
        return AWSResponse(request.url, 200, {"Content-Type": "application/json"}, _Raw(json.dumps(payload).encode()))
