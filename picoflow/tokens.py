"""Token accounting: turn the usage a model reports on a message into the 7-field ``TokenUsage`` record."""

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

    input_details = _mapping(normalised.get("input_token_details"))
    output_details = _mapping(normalised.get("output_token_details"))
    prompt_details = _mapping(raw.get("prompt_tokens_details")) or _mapping(raw.get("input_tokens_details"))
    completion_details = _mapping(raw.get("completion_tokens_details")) or _mapping(raw.get("output_tokens_details"))

    cached = _first(
        _detail(input_details, "cache_read"),
        _int(prompt_details.get("cached_tokens")),
        _int(raw.get("cache_read_input_tokens")),
        _int(raw.get("cached_content_token_count")),
        _int(raw.get("cachedContentTokenCount")),
    )
    cache_creation = _first(
        _detail(input_details, "cache_creation"),
        _int(prompt_details.get("cache_write_tokens")),
        _int(raw.get("cache_creation_input_tokens")),
    )

    if "input_tokens" in normalised:
        input_tokens = _int(normalised.get("input_tokens")) or 0
    else:
        input_tokens = _first(
            _int(raw.get("prompt_tokens")),
            _int(raw.get("prompt_token_count")),
            _int(raw.get("promptTokenCount")),
        )
        if input_tokens is None:
            # Anthropic's raw ``input_tokens`` leaves out cache reads and writes; LangChain adds them back.
            input_tokens = (_int(raw.get("input_tokens")) or 0) + _anthropic_cache_tokens(raw)

    candidates = _first(_int(raw.get("candidates_token_count")), _int(raw.get("candidatesTokenCount")))
    if "output_tokens" in normalised:
        output_tokens = _int(normalised.get("output_tokens")) or 0
    else:
        output_tokens = _first(_int(raw.get("completion_tokens")), _int(raw.get("output_tokens")), candidates) or 0

    reasoning = _first(_detail(output_details, "reasoning"), _int(completion_details.get("reasoning_tokens")))
    thoughts = _first(
        _int(output_details.get("thoughts")),
        _int(raw.get("thoughts_token_count")),
        _int(raw.get("thoughtsTokenCount")),
    )
    if reasoning is None and thoughts:
        reasoning = thoughts
        already_counted = candidates is not None and output_tokens >= candidates + thoughts
        if not already_counted:
            # Gemini counts thoughts apart from the candidate output it bills with them.
            output_tokens += thoughts

    reported_total = _first(
        _int(normalised.get("total_tokens")),
        _int(raw.get("total_tokens")),
        _int(raw.get("total_token_count")),
        _int(raw.get("totalTokenCount")),
    )
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


def _raw_usage(response_metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in _RAW_USAGE_KEYS:
        block = _mapping(response_metadata.get(key))
        if block:
            return block
    return {}


def _anthropic_cache_tokens(raw: Mapping[str, Any]) -> int:
    return (_int(raw.get("cache_read_input_tokens")) or 0) + (_int(raw.get("cache_creation_input_tokens")) or 0)


def _detail(details: Mapping[str, Any], kind: str) -> int | None:
    """A detail count, including service-tier variants such as ``priority_cache_read``."""
    values = [_int(v) for k, v in details.items() if k == kind or k.endswith(f"_{kind}")]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return {}
