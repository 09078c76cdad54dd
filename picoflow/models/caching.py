"""Prompt caching: cache points on the stable prefix of a request, and the per-turn notes sent after it.

Providers discount the part of a request identical to the start of a recent one. OpenAI-family servers do it
on their own; Anthropic's Messages API and Bedrock's Converse API only up to the cache points a request
marks. ``prompt_caching`` makes a chat model class mark three of them on every request: the last tool, the
step's system prompt, and the last message of the stored history. Whatever follows that message (the
``TurnNotesMessage`` a step's ``get_turn_notes()`` produces) stays outside the cached prefix, so per-turn data
costs only its own tokens and never invalidates the history before it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage

from picoflow.errors import PicoFlowError
from picoflow.messages import TurnNotesMessage

PROMPT_CACHE_PARAM = "prompt_cache"
"""The selection parameter of the ``anthropic`` and ``bedrock`` providers that turns cache points off
(``params={"prompt_cache": False}``); they are on by default."""


ANTHROPIC_CACHE_CONTROL = {"type": "ephemeral"}
BEDROCK_CACHE_POINT = {"cachePoint": {"type": "default"}}


def check_prompt_cache(label: str, params: Mapping[str, Any]) -> None:
    """Reject a ``prompt_cache`` parameter that is not a boolean."""
    value = params.get(PROMPT_CACHE_PARAM, True)
    if not isinstance(value, bool):
        raise PicoFlowError(f"Model '{label}' {PROMPT_CACHE_PARAM} must be true or false, got {value!r}.")


@dataclass(frozen=True)
class CachePoints:
    """How one provider marks a cache point, and where its models accept one."""

    #: The content blocks of a message, marked as the end of a cached prefix.
    mark: Callable[[list[Any]], list[Any]]
    #: The tool list with a point after its last tool, or None when the model takes no point among tools.
    mark_tools: Callable[[list[Any]], list[Any]] | None
    #: Whether a point may follow a tool result.
    after_tool_results: bool = True

    def request(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """``messages`` with points on the leading system prompt and on the last message before the notes."""
        marked = list(messages)
        if marked and isinstance(marked[0], SystemMessage):
            marked[0] = self._marked(marked[0])
        stable = [i for i, m in enumerate(marked) if not isinstance(m, TurnNotesMessage)]
        if not stable:
            return marked
        last = marked[stable[-1]]
        # Only a user-side message can end the history here: an AI message's tool calls would follow the point.
        if isinstance(last, HumanMessage) or (isinstance(last, ToolMessage) and self.after_tool_results):
            marked[stable[-1]] = self._marked(last)
        return marked

    def _marked(self, message: BaseMessage) -> BaseMessage:
        content = message.content
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if not blocks or blocks == [{"type": "text", "text": ""}]:
            return message
        return message.model_copy(update={"content": self.mark(blocks)})


def _anthropic_mark(blocks: list[Any]) -> list[Any]:
    last = blocks[-1]
    last = {"type": "text", "text": last} if isinstance(last, str) else last
    return [*blocks[:-1], {**last, "cache_control": dict(ANTHROPIC_CACHE_CONTROL)}]


def _anthropic_tools(tools: list[Any]) -> list[Any]:
    from langchain_anthropic import convert_to_anthropic_tool

    return [*tools[:-1], {**convert_to_anthropic_tool(tools[-1]), "cache_control": dict(ANTHROPIC_CACHE_CONTROL)}]


def _bedrock_mark(blocks: list[Any]) -> list[Any]:
    return [*blocks, dict(BEDROCK_CACHE_POINT)]


def _bedrock_tools(tools: list[Any]) -> list[Any]:
    return [*tools, dict(BEDROCK_CACHE_POINT)]


ANTHROPIC_POINTS = CachePoints(mark=_anthropic_mark, mark_tools=_anthropic_tools)
BEDROCK_CLAUDE_POINTS = CachePoints(mark=_bedrock_mark, mark_tools=_bedrock_tools)
# Nova caches system and messages only, and refuses a point beside a tool result.
BEDROCK_NOVA_POINTS = CachePoints(mark=_bedrock_mark, mark_tools=None, after_tool_results=False)


def bedrock_points(model_id: str) -> CachePoints | None:
    """The cache points of a Bedrock model or inference profile ID, or None for a model that caches nothing."""
    if "anthropic.claude" in model_id:
        return BEDROCK_CLAUDE_POINTS
    if "amazon.nova" in model_id:
        return BEDROCK_NOVA_POINTS
    return None


@functools.cache
def prompt_caching(chat_class: type, points: CachePoints) -> type:
    """A subclass of the LangChain chat model class ``chat_class`` whose requests carry ``points``."""

    class PromptCaching(chat_class):  # type: ignore[misc]
        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            tools = list(tools)
            if tools and points.mark_tools is not None:
                tools = points.mark_tools(tools)
            return super().bind_tools(tools, **kwargs)

        # The explicit signatures matter: LangChain passes run_manager only to a method that declares it.
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            return super()._generate(points.request(messages), stop=stop, run_manager=run_manager, **kwargs)

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            return await super()._agenerate(points.request(messages), stop=stop, run_manager=run_manager, **kwargs)

        def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Iterator[Any]:
            yield from super()._stream(points.request(messages), stop=stop, run_manager=run_manager, **kwargs)

        async def _astream(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> AsyncIterator[Any]:
            async for chunk in super()._astream(points.request(messages), stop=stop, run_manager=run_manager,
                                                **kwargs):
                yield chunk

    PromptCaching.__name__ = PromptCaching.__qualname__ = chat_class.__name__
    return PromptCaching
