from langchain_core.messages import AIMessage

from picoflow.messages import add_usage, usage_from_message
from picoflow.session.document import TokenUsage


def _fields(usage: TokenUsage) -> dict[str, int]:
    return usage.model_dump()


def test_plain_usage_metadata_gives_billable_totals() -> None:
    message = AIMessage(content="hi", usage_metadata={"input_tokens": 10, "output_tokens": 4, "total_tokens": 14})

    assert _fields(usage_from_message(message)) == {
        "input_tokens": 10,
        "output_tokens": 4,
        "total_tokens": 14,
        "reasoning_tokens": 0,
        "visible_output_tokens": 4,
        "cached_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def test_openai_reasoning_and_cache_reads_are_subsets_of_output_and_input() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 100,
            "output_tokens": 50,
            "total_tokens": 150,
            "input_token_details": {"cache_read": 60},
            "output_token_details": {"reasoning": 30},
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (100, 50, 150)
    assert usage.reasoning_tokens == 30
    assert usage.visible_output_tokens == 20
    assert usage.cached_input_tokens == 60


def test_raw_openai_usage_in_response_metadata_is_used_when_usage_metadata_is_missing() -> None:
    message = AIMessage(
        content="answer",
        response_metadata={
            "token_usage": {
                "prompt_tokens": 80,
                "completion_tokens": 40,
                "total_tokens": 120,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 16},
            }
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (80, 40, 120)
    assert (usage.reasoning_tokens, usage.visible_output_tokens, usage.cached_input_tokens) == (16, 24, 64)


def test_the_same_numbers_in_both_places_are_counted_once() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 80,
            "output_tokens": 40,
            "total_tokens": 120,
            "input_token_details": {"cache_read": 64},
            "output_token_details": {"reasoning": 16},
        },
        response_metadata={
            "token_usage": {
                "prompt_tokens": 80,
                "completion_tokens": 40,
                "total_tokens": 120,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 16},
            }
        },
    )
    total = TokenUsage()

    add_usage(total, message)

    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (80, 40, 120)
    assert (total.reasoning_tokens, total.visible_output_tokens, total.cached_input_tokens) == (16, 24, 64)


def test_reasoning_only_in_response_metadata_fills_the_breakdown() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={"input_tokens": 20, "output_tokens": 30, "total_tokens": 50},
        response_metadata={"token_usage": {"completion_tokens_details": {"reasoning_tokens": 12}}},
    )

    usage = usage_from_message(message)

    assert (usage.output_tokens, usage.reasoning_tokens, usage.visible_output_tokens) == (30, 12, 18)


def test_service_tier_detail_keys_are_recognised() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 50,
            "output_tokens": 10,
            "total_tokens": 60,
            "input_token_details": {"priority_cache_read": 20, "priority": 30},
            "output_token_details": {"priority_reasoning": 4, "priority": 6},
        },
    )

    usage = usage_from_message(message)

    assert (usage.cached_input_tokens, usage.reasoning_tokens, usage.visible_output_tokens) == (20, 4, 6)


def test_claude_cache_creation_and_reads_are_subsets_of_input() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 1200,
            "output_tokens": 30,
            "total_tokens": 1230,
            "input_token_details": {"cache_read": 800, "cache_creation": 300},
        },
        response_metadata={
            "usage": {"input_tokens": 100, "output_tokens": 30, "cache_read_input_tokens": 800,
                      "cache_creation_input_tokens": 300}
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.total_tokens) == (1200, 1230)
    assert (usage.cached_input_tokens, usage.cache_creation_input_tokens) == (800, 300)


def test_raw_anthropic_usage_alone_counts_cache_tokens_as_input() -> None:
    message = AIMessage(
        content="answer",
        response_metadata={
            "usage": {"input_tokens": 100, "output_tokens": 30, "cache_read_input_tokens": 800,
                      "cache_creation_input_tokens": 300}
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (1200, 30, 1230)
    assert (usage.cached_input_tokens, usage.cache_creation_input_tokens) == (800, 300)


def test_gemini_thoughts_reported_apart_are_added_to_output_and_total() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 10,
            "output_tokens": 5,
            "total_tokens": 15,
            "output_token_details": {"thoughts": 7},  # type: ignore[typeddict-unknown-key]
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (10, 12, 22)
    assert (usage.reasoning_tokens, usage.visible_output_tokens) == (7, 5)


def test_gemini_raw_thoughts_token_count_is_added_to_output() -> None:
    message = AIMessage(
        content="answer",
        response_metadata={
            "usage_metadata": {
                "prompt_token_count": 10,
                "candidates_token_count": 5,
                "thoughts_token_count": 7,
                "total_token_count": 22,
                "cached_content_token_count": 4,
            }
        },
    )

    usage = usage_from_message(message)

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (10, 12, 22)
    assert (usage.reasoning_tokens, usage.visible_output_tokens, usage.cached_input_tokens) == (7, 5, 4)


def test_gemini_thoughts_already_folded_into_output_are_not_added_again() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={
            "input_tokens": 10,
            "output_tokens": 12,
            "total_tokens": 22,
            "output_token_details": {"reasoning": 7},
        },
        response_metadata={
            "usage_metadata": {"prompt_token_count": 10, "candidates_token_count": 5, "thoughts_token_count": 7}
        },
    )

    usage = usage_from_message(message)

    assert (usage.output_tokens, usage.total_tokens, usage.reasoning_tokens) == (12, 22, 7)


def test_gemini_thoughts_with_output_already_including_them_per_candidates_count() -> None:
    message = AIMessage(
        content="answer",
        usage_metadata={"input_tokens": 10, "output_tokens": 12, "total_tokens": 22},
        response_metadata={
            "usage_metadata": {"prompt_token_count": 10, "candidates_token_count": 5, "thoughts_token_count": 7}
        },
    )

    usage = usage_from_message(message)

    assert (usage.output_tokens, usage.total_tokens, usage.reasoning_tokens, usage.visible_output_tokens) == (
        12,
        22,
        7,
        5,
    )


def test_missing_total_defaults_to_input_plus_output() -> None:
    message = AIMessage(content="hi", response_metadata={"token_usage": {"prompt_tokens": 7, "completion_tokens": 3}})

    assert usage_from_message(message).total_tokens == 10


def test_a_message_without_usage_adds_nothing() -> None:
    total = TokenUsage(input_tokens=5, output_tokens=2, total_tokens=7, visible_output_tokens=2)
    before = total.model_dump()

    add_usage(total, AIMessage(content="hi", response_metadata={"finish_reason": "stop"}))
    add_usage(total, None)

    assert total.model_dump() == before
    assert usage_from_message(AIMessage(content="hi")) == TokenUsage()


def test_add_usage_accumulates_across_calls() -> None:
    total = TokenUsage()
    usage = {"input_tokens": 10, "output_tokens": 6, "total_tokens": 16, "output_token_details": {"reasoning": 2}}

    add_usage(total, AIMessage(content="a", usage_metadata=usage))
    add_usage(total, AIMessage(content="b", usage_metadata=usage))

    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (20, 12, 32)
    assert (total.reasoning_tokens, total.visible_output_tokens) == (4, 8)


def test_a_structured_output_result_with_raw_is_tallied_from_its_raw_message() -> None:
    raw = AIMessage(content="{}", usage_metadata={"input_tokens": 3, "output_tokens": 1, "total_tokens": 4})

    usage = usage_from_message({"raw": raw, "parsed": {}, "parsing_error": None})

    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (3, 1, 4)
