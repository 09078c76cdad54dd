"""A deterministic provider that replays scripted model replies, for offline runs and tests."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, OutputTokenDetails, UsageMetadata
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field

from picoflow.deadline import current_scope
from picoflow.errors import PicoFlowError, ScriptedModelError, ScriptExhaustedError
from picoflow.files.refs import KNOWN_TYPES
from picoflow.messages import FINISH_KEYS
from picoflow.models.anthropic import ANTHROPIC_VOCABULARY
from picoflow.models.bedrock import BEDROCK_VOCABULARY
from picoflow.models.calls import CALL_PURPOSES, CallPurpose
from picoflow.models.conversations import check_conversation as check_conversation
from picoflow.models.conversations import conversation_problems as conversation_problems
from picoflow.models.google import GOOGLE_VOCABULARY
from picoflow.models.openai import OPENAI_VOCABULARY
from picoflow.models.registry import ModelProvider, ModelSelection
from picoflow.parsing import strip_fence

Reply = AIMessage | Mapping[str, Any]

_REPLY_KEYS = frozenset(
    {"content", "tool_calls", "usage", "response_metadata", "refusal", "delay", "error", "status", "step", "tools",
     "for", "chunk_delay", "break_after"}
)
_USAGE_KEYS = frozenset(
    {"input_tokens", "output_tokens", "total_tokens", "input_token_details", "output_token_details"}
)


class ScriptedProvider(ModelProvider):
    """Serves each model call with the next reply of a fixed script.

    A reply is an ``AIMessage`` or a dict with ``content`` (a string, or a dict sent as JSON),
    ``tool_calls`` (``[{"name", "args", "id"?}]``), ``usage`` (``input_tokens``, ``output_tokens`` and
    optionally ``total_tokens``, ``input_token_details``, ``output_token_details``), ``response_metadata``,
    ``refusal`` (a provider refusal text, carried in ``additional_kwargs`` as OpenAI does),
    ``delay`` (seconds to wait before answering) and ``error`` (a message to raise instead of answering, as a
    failure of HTTP status ``status``: 503 by default, which is retried; 400 or 401 are not).

    Streamed (``astream``), a reply's text comes word by word, ``chunk_delay`` seconds apart after the first
    (which comes after ``delay``), its tool calls, usage and metadata in a last chunk. An ``error`` reply with
    ``break_after`` streams that many words of its ``content`` before failing.

    Every call has a purpose: ``chat`` (a step's reply), ``decision`` (a DecisionStep's questions, answered by a
    JSON object with one probability per option), ``summary`` (a memory compaction's rolling summary) or ``judge``
    (``picoflow eval`` scoring a reply: a JSON ``{"score", "reason"}``), and a reply answers only calls of its
    ``for`` (``chat`` when it has none). Summary and judge calls take nothing but a reply marked for them, so a
    summary never stores a reply meant for the user and a flow never shows a verdict; a decision call also
    takes replies without ``for`` when the script marks none for decisions (as scripts did before purposes
    existed). A reply with ``step`` (and optionally ``tools``, the exact set of tool names bound to the call)
    answers only the calls of that step, whatever order concurrent workers call in, and is preferred to replies
    without one, which are served in script order. A call that finds no reply raises an error naming its number,
    purpose and step.

    With ``strict`` (the default) every request is checked against the Chat Completions rules first (see
    ``conversation_problems`` below): a conversation the real service would refuse fails here too.
    A provider block is scripted as ``{"response_metadata": {"finish_reason": "content_filter"}}``, and a stream cut
    before its end (no finish reason, as when a proxy closes the connection) as ``{"response_metadata":
    {"finish_reason": None}}``.

    For each call, ``calls`` holds copies of the messages the model received, ``tools`` the names of the
    tools bound to it, ``purposes`` its purpose and ``selections`` the model selection it was built for. Every
    chat model built by one provider shares its script; providers with different names keep independent scripts.
    """

    #: It reads nothing, so it takes every file type the API can accept.
    file_types = KNOWN_TYPES
    #: A script stands in for any built-in provider, so its replies and errors may use any one's words.
    vocabulary = OPENAI_VOCABULARY.merged(ANTHROPIC_VOCABULARY, GOOGLE_VOCABULARY, BEDROCK_VOCABULARY)

    def __init__(self, script: Iterable[Reply], name: str = "scripted", *, strict: bool = True) -> None:
        self.name = name
        self.strict = strict
        self._script = [_checked_reply(reply, index) for index, reply in enumerate(script)]
        self._used = [False] * len(self._script)
        self._first_unused = 0
        # Scripts that mark no decision reply answer decisions from their unmarked replies, as they always did.
        self._decisions_unmarked = not any(_purpose(reply) == "decision" for reply in self._script)
        self._lock = threading.Lock()
        self.calls: list[list[BaseMessage]] = []
        self.tools: list[list[str]] = []
        self.purposes: list[CallPurpose] = []
        self.selections: list[ModelSelection] = []

    @classmethod
    def from_file(cls, path: str | Path, name: str = "scripted") -> ScriptedProvider:
        """A provider replaying the JSON list of replies stored at ``path``."""
        try:
            script = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PicoFlowError(f"Cannot read the model script '{path}': {exc}") from exc
        if not isinstance(script, list):
            raise PicoFlowError(f"The model script '{path}' must be a JSON list of replies.")
        return cls(script, name=name)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been used yet."""
        with self._lock:
            return self._used.count(False)

    def chat_model(self, selection: ModelSelection) -> ScriptedChatModel:
        """A chat model answering from this provider's script, whatever provider ``selection`` names."""
        return ScriptedChatModel(provider=self, selection=selection)

    def _take(self, messages: Sequence[BaseMessage], tool_names: list[str], selection: ModelSelection) -> _Turn:
        scope = current_scope()
        step, purpose = scope.step, scope.purpose
        with self._lock:
            self.calls.append([message.model_copy(deep=True) for message in messages])
            self.tools.append(tool_names)
            self.purposes.append(purpose)
            self.selections.append(selection)
            call_number = len(self.calls)
            if self.strict:
                # Refuse what the real service would refuse, before spending a reply on it.
                check_conversation(messages)
            index = self._next_reply(purpose, step, tool_names)
            if index is None:
                unused = self._used.count(False)
                raise ScriptExhaustedError(
                    f"Scripted provider '{self.name}' has no reply for model call {call_number}, a {purpose} call"
                    f"{f' of step {step!r}' if step else ''}: {unused} of its {len(self._script)} replies are unused"
                    f" and none answers this call. {_wanted(purpose, step)}"
                )
            self._used[index] = True
            while self._first_unused < len(self._used) and self._used[self._first_unused]:
                self._first_unused += 1
            reply = self._script[index]
        return _Turn.build(reply, call_number, self.name, selection.name)

    def _next_reply(self, purpose: CallPurpose, step: str | None, tool_names: list[str]) -> int | None:
        """The first unused reply for this purpose keyed to this step (and tool set), else the first unkeyed one."""
        unkeyed = None
        for index in range(self._first_unused, len(self._script)):
            reply = self._script[index]
            if self._used[index] or not self._serves(reply, purpose):
                continue
            key = _key(reply)
            if key is None:
                unkeyed = index if unkeyed is None else unkeyed
            elif key[0] == step and (key[1] is None or key[1] == frozenset(tool_names)):
                return index
        return unkeyed

    def _serves(self, reply: Reply, purpose: CallPurpose) -> bool:
        scripted = _purpose(reply)
        if scripted is None:
            return purpose == "chat" or (purpose == "decision" and self._decisions_unmarked)
        return scripted == purpose


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model whose every call takes the next reply of its ``ScriptedProvider``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    provider: ScriptedProvider = Field(exclude=True)
    selection: ModelSelection

    @property
    def _llm_type(self) -> str:
        return "picoflow-scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"provider": self.provider.name, "model": self.selection.name}

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        turn = self._turn(messages, kwargs)
        if turn.delay:
            time.sleep(turn.delay)
        return turn.result()

    async def _agenerate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return (await self._arriving(messages, kwargs)).result()

    async def _astream(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        turn = await self._arriving(messages, kwargs)
        for index, chunk in enumerate(turn.chunks()):
            if index and turn.chunk_delay:
                await asyncio.sleep(turn.chunk_delay)
            yield chunk

    def _turn(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> _Turn:
        # The tools a call was bound with arrive among its keyword arguments.
        return self.provider._take(messages, _tool_names(kwargs.get("tools")), self.selection)

    async def _arriving(self, messages: list[BaseMessage], kwargs: Mapping[str, Any]) -> _Turn:
        """The next scripted turn, once its delay has passed without blocking the loop."""
        turn = self._turn(messages, kwargs)
        if turn.delay:
            await asyncio.sleep(turn.delay)
        return turn

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with ``tools`` (any form ``convert_to_openai_tool`` accepts) recorded on every call."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """Parse the next reply's content as JSON (fences allowed), or else take its first tool call's args.

        A pydantic class gives an instance of it, a dict schema a dict. With ``include_raw`` the result is
        ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``, so usage can still be tallied from
        ``raw`` and a parse failure is reported instead of raised.
        """

        def parse(message: AIMessage) -> Any:
            return _parse_structured(message, schema)

        def parse_with_raw(message: AIMessage) -> dict[str, Any]:
            try:
                return {"raw": message, "parsed": parse(message), "parsing_error": None}
            except OutputParserException as exc:
                return {"raw": message, "parsed": None, "parsing_error": exc}

        return self | RunnableLambda(parse_with_raw if include_raw else parse)


# A streamed reply's pieces: each word with the whitespace before it.
_PIECES = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class _Turn:
    message: AIMessage | None
    error: str | None
    delay: float
    status: int = 503
    chunk_delay: float = 0.0
    break_after: int | None = None

    @classmethod
    def build(cls, reply: Reply, call_number: int, provider_name: str, model_name: str) -> _Turn:
        if isinstance(reply, AIMessage):
            message = reply.model_copy(deep=True)
            message.tool_calls = _with_ids(message.tool_calls, call_number, provider_name)
            if not any(key in message.response_metadata for key in FINISH_KEYS):
                # A whole reply ends with a reason, as every provider's does (a stream without one was cut).
                message.response_metadata["finish_reason"] = "tool_calls" if message.tool_calls else "stop"
            return cls(message=message, error=None, delay=0.0)
        delay = float(reply.get("delay") or 0)
        chunk_delay = float(reply.get("chunk_delay") or 0)
        if reply.get("error") is not None:
            partial = AIMessage(content=str(reply.get("content") or ""))
            return cls(message=None if reply.get("break_after") is None else partial, error=str(reply["error"]),
                       delay=delay, status=int(reply.get("status") or 503), chunk_delay=chunk_delay,
                       break_after=reply.get("break_after"))
        content = reply.get("content", "")
        if isinstance(content, dict):
            content = json.dumps(content)
        calls = [
            {"name": call["name"], "args": dict(call.get("args") or {}), "id": call.get("id")}
            for call in reply.get("tool_calls") or []
        ]
        tool_calls = _with_ids(calls, call_number, provider_name)
        metadata = {"model_name": model_name, "finish_reason": "tool_calls" if tool_calls else "stop"}
        metadata.update(reply.get("response_metadata") or {})
        message = AIMessage(
            content=content,
            tool_calls=tool_calls,
            usage_metadata=_usage(reply.get("usage")),
            response_metadata=metadata,
            additional_kwargs={"refusal": str(reply["refusal"])} if reply.get("refusal") else {},
        )
        return cls(message=message, error=None, delay=delay, chunk_delay=chunk_delay)

    def result(self) -> ChatResult:
        if self.message is None or self.error is not None:
            raise ScriptedModelError(self.error, self.status)
        return ChatResult(generations=[ChatGeneration(message=self.message)])

    def chunks(self) -> Iterator[ChatGenerationChunk]:
        """The reply as a stream: its words, then its tool calls, usage and metadata (or the scripted error)."""
        message = self.message
        if message is None:
            raise ScriptedModelError(self.error, self.status)
        content = message.content
        pieces = _PIECES.findall(content) if isinstance(content, str) else [content]
        if self.error is not None:
            for piece in pieces[: self.break_after]:
                yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
            raise ScriptedModelError(self.error, self.status)
        for piece in pieces:
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        calls: list[ToolCallChunk] = [
            {"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": index}
            for index, call in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", tool_call_chunks=calls, usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata, additional_kwargs=message.additional_kwargs,
        ))


def _checked_reply(reply: Any, index: int) -> Reply:
    where = f"Scripted reply {index + 1}"
    if isinstance(reply, AIMessage):
        return reply
    if not isinstance(reply, Mapping):
        raise PicoFlowError(f"{where} must be an AIMessage or a dict, not {type(reply).__name__}.")
    unknown = sorted(set(reply) - _REPLY_KEYS)
    if unknown:
        raise PicoFlowError(f"{where} has unknown key(s) {', '.join(unknown)}.")
    for call in reply.get("tool_calls") or []:
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise PicoFlowError(f"{where} has a tool call without a name.")
    usage = reply.get("usage")
    if usage is not None and (not isinstance(usage, Mapping) or set(usage) - _USAGE_KEYS):
        raise PicoFlowError(f"{where} usage may only hold {', '.join(sorted(_USAGE_KEYS))}.")
    delay = reply.get("delay")
    if delay is not None and (not isinstance(delay, int | float) or delay < 0):
        raise PicoFlowError(f"{where} delay must be a non-negative number of seconds.")
    status = reply.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599):
        raise PicoFlowError(f"{where} status must be an HTTP error status (400 to 599).")
    if status is not None and reply.get("error") is None:
        raise PicoFlowError(f"{where} sets a status without an error.")
    chunk_delay = reply.get("chunk_delay")
    if chunk_delay is not None and (not isinstance(chunk_delay, int | float) or chunk_delay < 0):
        raise PicoFlowError(f"{where} chunk_delay must be a non-negative number of seconds.")
    pieces = reply.get("break_after")
    if pieces is not None and (reply.get("error") is None or not isinstance(pieces, int) or pieces < 0):
        raise PicoFlowError(f"{where} break_after must be a word count given with an error.")
    if "step" in reply and (not isinstance(reply["step"], str) or not reply["step"]):
        raise PicoFlowError(f"{where} step must name the step the reply answers.")
    tools = reply.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        raise PicoFlowError(f"{where} tools must be a list of tool names.")
    if tools is not None and "step" not in reply:
        raise PicoFlowError(f"{where} names tools but no step.")
    purpose = reply.get("for")
    if purpose is not None and purpose not in CALL_PURPOSES:
        raise PicoFlowError(f"{where} \"for\" must be one of {', '.join(CALL_PURPOSES)}, not {purpose!r}.")
    if purpose in ("summary", "judge") and "step" in reply:
        raise PicoFlowError(f"{where} is for a {purpose} but names a step: {purpose} calls belong to no step.")
    return reply


def _key(reply: Reply) -> tuple[str, frozenset[str] | None] | None:
    if isinstance(reply, Mapping) and reply.get("step"):
        tools = reply.get("tools")
        return str(reply["step"]), frozenset(tools) if tools is not None else None
    return None


def _purpose(reply: Reply) -> str | None:
    return reply.get("for") if isinstance(reply, Mapping) else None


def _wanted(purpose: CallPurpose, step: str | None) -> str:
    """What the script needs so that a call of ``purpose`` and ``step`` finds a reply."""
    if purpose == "summary":
        return 'A compaction summary takes only a reply with "for": "summary".'
    if purpose == "judge":
        return 'A judge call takes only a reply with "for": "judge".'
    keyed = f' (optionally with "step": "{step}")' if step else ""
    if purpose == "chat":
        return f'Add a reply without "for" or with "for": "chat"{keyed}.'
    return f'Add a reply with "for": "decision"{keyed}.'


def _with_ids(tool_calls: list[Any], call_number: int, provider_name: str) -> list[Any]:
    return [
        {**call, "id": call.get("id") or f"call_{provider_name}_{call_number}_{index + 1}"}
        for index, call in enumerate(tool_calls)
    ]


def _usage(usage: Mapping[str, Any] | None) -> UsageMetadata | None:
    if usage is None:
        return None
    input_tokens = int(usage.get("input_tokens") or 0)
    output_tokens = int(usage.get("output_tokens") or 0)
    result = UsageMetadata(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=int(usage.get("total_tokens") or input_tokens + output_tokens),
    )
    # Copied key by key: a script may name details LangChain does not know, and they pass through.
    if usage.get("input_token_details"):
        result["input_token_details"] = InputTokenDetails()
        result["input_token_details"].update(usage["input_token_details"])
    if usage.get("output_token_details"):
        result["output_token_details"] = OutputTokenDetails()
        result["output_token_details"].update(usage["output_token_details"])
    return result


def _tool_names(tools: Any) -> list[str]:
    names: list[str] = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        names.append(name if isinstance(name, str) else str(tool))
    return names


def _parse_structured(message: AIMessage, schema: dict[str, Any] | type) -> Any:
    text = strip_fence(str(message.text))
    if not text and not message.tool_calls:
        raise OutputParserException("The scripted reply carries neither JSON content nor a tool call.")
    try:
        data = json.loads(text) if text else message.tool_calls[0]["args"]
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(data)
    except ValueError as exc:
        raise OutputParserException(f"The scripted reply does not match the output schema: {exc}") from exc
    if not isinstance(data, dict):
        raise OutputParserException("The scripted reply's structured output is not a JSON object.")
    return data
