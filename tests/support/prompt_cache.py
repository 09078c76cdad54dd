"""The providers' prompt-caching rules, for fake model servers that report cached tokens as the real APIs do.

Tokens are approximated as 4 UTF-8 bytes each (rounded up per block): no tokenizer file is needed offline,
and the rules only compare prefixes, so the same approximation on both sides of a comparison is fair.

- OpenAI (``OpenAIPrefixCache``): automatic. A request whose prompt starts with the prompt of a request seen
  within the lifetime reads the common prefix from the cache once it is at least 1,024 tokens, rounded down
  to 1,024 + a multiple of 128. The prompt is the tool list followed by the messages, as JSON.
- Anthropic and Bedrock (``BlockPrefixCache``): explicit. A request is a sequence of content blocks (tools,
  then system, then messages); a cache point after a block caches the prefix through it, if that prefix has
  at least the model's minimum of tokens. A point reads the longest cached prefix ending at it or at one of
  the 20 blocks before it; the prefix up to the request's last point that was not read is written. An entry
  lives 5 minutes from its last use; at most 4 points per request.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BYTES_PER_TOKEN = 4
LIFETIME_SECONDS = 300.0
OPENAI_MINIMUM = 1024
OPENAI_STEP = 128
#: Claude Sonnet 4.5's minimum (Sonnet 4, Opus 4 and 4.1 share it; Haiku and the newest Opus need more).
CLAUDE_MINIMUM = 1024
LOOKBACK_BLOCKS = 20
MAX_POINTS = 4


def count_tokens(data: str | bytes) -> int:
    """The approximate token count of ``data``: its UTF-8 bytes / 4, rounded up."""
    size = len(data.encode() if isinstance(data, str) else data)
    return math.ceil(size / BYTES_PER_TOKEN)


@dataclass(frozen=True)
class CacheUsage:
    """What one request cost in input tokens: all of them, those read from the cache, those written to it."""

    input_tokens: int
    cache_read: int = 0
    cache_write: int = 0

    @property
    def uncached(self) -> int:
        return self.input_tokens - self.cache_read - self.cache_write


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (binary search over slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def openai_prompt(body: dict[str, Any]) -> bytes:
    """The prompt of a chat completions request as the cache compares it: tools first, then the messages."""
    return json.dumps({"tools": body.get("tools") or [], "messages": body.get("messages") or []}).encode()


class OpenAIPrefixCache:
    """OpenAI's automatic prompt cache (see the module documentation); ``clock`` gives seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, minimum: int = OPENAI_MINIMUM,
                 step: int = OPENAI_STEP, lifetime: float = LIFETIME_SECONDS) -> None:
        self.clock, self.minimum, self.step, self.lifetime = clock, minimum, step, lifetime
        self._entries: dict[bytes, float] = {}

    def request(self, prompt: bytes) -> CacheUsage:
        now = self.clock()
        self._entries = {text: until for text, until in self._entries.items() if until > now}
        best, hit = 0, None
        for text in self._entries:
            shared = _common_prefix(prompt, text) // BYTES_PER_TOKEN
            if shared > best:
                best, hit = shared, text
        total = count_tokens(prompt)
        cached = 0
        if best >= self.minimum:
            cached = min(self.minimum + (best - self.minimum) // self.step * self.step, total)
            self._entries[hit] = now + self.lifetime  # type: ignore[index]
        if total >= self.minimum:
            self._entries[prompt] = now + self.lifetime
        return CacheUsage(total, cache_read=cached)


@dataclass(frozen=True)
class Block:
    """One content block as the cache sees it: its tokens, and whether a cache point follows it."""

    key: bytes
    tokens: int
    point: bool = False


def block(content: Any, point: bool = False, role: str = "") -> Block:
    """A block of ``content`` (text as is, anything else as JSON) in a message of ``role``; the role is part of
    what the cache compares, but only the content counts as tokens."""
    data = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    return Block(f"{role}:{data}".encode(), count_tokens(data), point)


class BlockPrefixCache:
    """Anthropic's and Bedrock's prompt cache up to explicit cache points (see the module documentation)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, minimum: int = CLAUDE_MINIMUM,
                 lifetime: float = LIFETIME_SECONDS) -> None:
        self.clock, self.minimum, self.lifetime = clock, minimum, lifetime
        self._entries: dict[bytes, float] = {}

    def request(self, blocks: list[Block]) -> CacheUsage:
        points = [i for i, b in enumerate(blocks) if b.point]
        if len(points) > MAX_POINTS:
            raise ValueError(too_many_points(len(points)))
        now = self.clock()
        self._entries = {key: until for key, until in self._entries.items() if until > now}
        keys, ends, digest, tokens = [], [], hashlib.sha256(), 0
        for b in blocks:
            digest.update(hashlib.sha256(b.key).digest())
            keys.append(digest.digest())
            tokens += b.tokens
            ends.append(tokens)
        hit = max(
            (j for p in points for j in range(max(p - LOOKBACK_BLOCKS, 0), p + 1) if keys[j] in self._entries),
            default=None,
        )
        read = ends[hit] if hit is not None else 0
        if hit is not None:
            self._entries[keys[hit]] = now + self.lifetime
        written = 0
        for p in points:
            if ends[p] >= self.minimum and (hit is None or p > hit):
                self._entries[keys[p]] = now + self.lifetime
                written = ends[p] - read
        return CacheUsage(tokens, cache_read=read, cache_write=written)


def too_many_points(points: int) -> str:
    """The API's refusal of a request with more cache points than it allows."""
    return f"A maximum of {MAX_POINTS} blocks with cache_control may be provided. Found {points}."


def _without(block_: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in block_.items() if k != key}


def anthropic_blocks(body: dict[str, Any]) -> list[Block]:
    """The blocks of a Messages API request: tools, system, then each message's content blocks."""
    blocks = [block(_without(t, "cache_control"), "cache_control" in t) for t in body.get("tools") or []]
    system = body.get("system") or []
    for part in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        blocks.append(block(part["text"], "cache_control" in part))
    for message in body.get("messages") or []:
        content = message["content"]
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            data = part["text"] if part.get("type") == "text" else _without(part, "cache_control")
            blocks.append(block(data, "cache_control" in part, message["role"]))
    return blocks


def bedrock_blocks(body: dict[str, Any]) -> list[Block]:
    """The blocks of a Converse request: tools, system, then each message's content; a cachePoint marks the
    block before it."""
    blocks: list[Block] = []

    def add(entries: list[dict[str, Any]], role: str = "") -> None:
        for entry in entries:
            if "cachePoint" in entry:
                blocks[-1] = Block(blocks[-1].key, blocks[-1].tokens, True)
            else:
                blocks.append(block(entry["text"] if set(entry) == {"text"} else entry, role=role))

    add((body.get("toolConfig") or {}).get("tools") or [])
    add(body.get("system") or [])
    for message in body.get("messages") or []:
        add(message["content"], message["role"])
    return blocks
