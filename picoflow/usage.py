"""Token accounting of model replies: what one reply reports it used, read from LangChain's normalised usage and
the provider's own block, and added to a running total."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from picoflow.session.document import TokenUsage

# Where providers put their raw usage block inside ``response_metadata``:
# OpenAI chat completions, Anthropic / OpenAI responses, Gemini.
_RAW_USAGE_KEYS = ("token_usage", "usage", "usage_metadata")


def usage_from_message(message: Any) -> TokenUsage:
    """The token usage one model reply reports, or an all-zero record when it reports none.

    ``message`` is an ``AIMessage`` (anything with ``usage_metadata`` / ``response_metadata``), or the
    ``{"raw": AIMessage, ...}`` dict a structured-output call returns with ``include_raw=True``.
    LangChain's normalised ``usage_metadata`` wins; the provider's raw block in ``response_metadata``
    only fills what it lacks, so the same numbers are never counted twice.
    """
    if isinstance(message, Mapping):
        message = message.get("raw")
    if message is None:
        return TokenUsage()
    normalised = _mapping(getattr(message, "usage_metadata", None))
    raw = _raw_usage(_mapping(getattr(message, "response_metadata", None)))
    if not normalised and not raw:
        return TokenUsage()

    # Every "first of" below is evaluated lazily, in the order of precedence: most replies carry only
    # LangChain's normalised counts, and the provider's raw block is read only for what they lack.
    input_details = _mapping(normalised.get("input_token_details"))
    output_details = _mapping(normalised.get("output_token_details"))
    if raw:
        prompt_details = _mapping(raw.get("prompt_tokens_details")) or _mapping(raw.get("input_tokens_details"))
        completion_details = _mapping(raw.get("completion_tokens_details")) or _mapping(
            raw.get("output_tokens_details")
        )
    else:
        prompt_details = completion_details = _EMPTY

    cached = _detail(input_details, "cache_read")
    if cached is None:
        cached = _first_int(prompt_details, ("cached_tokens",))
    if cached is None:
        cached = _first_int(raw, ("cache_read_input_tokens", "cached_content_token_count", "cachedContentTokenCount"))
    cache_creation = _detail(input_details, "cache_creation")
    if cache_creation is None:
        cache_creation = _first_int(prompt_details, ("cache_write_tokens",))
    if cache_creation is None:
        cache_creation = _first_int(raw, ("cache_creation_input_tokens",))

    if "input_tokens" in normalised:
        input_tokens = _int(normalised.get("input_tokens")) or 0
    else:
        raw_input = _first_int(raw, ("prompt_tokens", "prompt_token_count", "promptTokenCount"))
        # Anthropic's raw ``input_tokens`` leaves out cache reads and writes; LangChain adds them back.
        input_tokens = (
            raw_input if raw_input is not None else (_int(raw.get("input_tokens")) or 0) + _anthropic_cache_tokens(raw)
        )

    candidates = _first_int(raw, ("candidates_token_count", "candidatesTokenCount"))
    if "output_tokens" in normalised:
        output_tokens = _int(normalised.get("output_tokens")) or 0
    else:
        raw_output = _first_int(raw, ("completion_tokens", "output_tokens"))
        output_tokens = raw_output if raw_output is not None else candidates or 0

    reasoning = _detail(output_details, "reasoning")
    if reasoning is None:
        reasoning = _first_int(completion_details, ("reasoning_tokens",))
    thoughts = _int(output_details.get("thoughts")) if output_details else None
    if thoughts is None:
        thoughts = _first_int(raw, ("thoughts_token_count", "thoughtsTokenCount"))
    if reasoning is None and thoughts:
        reasoning = thoughts
        already_counted = candidates is not None and output_tokens >= candidates + thoughts
        if not already_counted:
            # Gemini counts thoughts apart from the candidate output it bills with them.
            output_tokens += thoughts

    reported_total = _int(normalised.get("total_tokens"))
    if reported_total is None:
        reported_total = _first_int(raw, ("total_tokens", "total_token_count", "totalTokenCount"))
    total_tokens = max(reported_total or 0, input_tokens + output_tokens)

    reasoning = min(reasoning or 0, output_tokens)
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        reasoning_tokens=reasoning,
        visible_output_tokens=output_tokens - reasoning,
        cached_input_tokens=min(cached or 0, input_tokens),
        cache_creation_input_tokens=min(cache_creation or 0, input_tokens),
    )


def add_usage(total: TokenUsage, message: Any) -> None:
    """Add the usage ``message`` reports (see ``usage_from_message``) to ``total`` in place."""
    total.add(usage_from_message(message))


_EMPTY: Mapping[str, Any] = {}


def _raw_usage(response_metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    if not response_metadata:
        return _EMPTY
    for key in _RAW_USAGE_KEYS:
        block = _mapping(response_metadata.get(key))
        if block:
            return block
    return _EMPTY


def _anthropic_cache_tokens(raw: Mapping[str, Any]) -> int:
    return (_int(raw.get("cache_read_input_tokens")) or 0) + (_int(raw.get("cache_creation_input_tokens")) or 0)


def _detail(details: Mapping[str, Any], kind: str) -> int | None:
    """A detail count, including service-tier variants such as ``priority_cache_read``."""
    if not details:
        return None
    values = [_int(v) for k, v in details.items() if k == kind or k.endswith(f"_{kind}")]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _first_int(block: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of ``keys`` whose value in ``block`` is a number."""
    if not block:
        return None
    for key in keys:
        value = _int(block.get(key))
        if value is not None:
            return value
    return None


def _int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    if type(value) is dict or isinstance(value, Mapping):
        return value
    if value is not None and hasattr(value, "model_dump"):
        dumped: Mapping[str, Any] = value.model_dump()
        return dumped
    return _EMPTY
