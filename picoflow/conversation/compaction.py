"""Rolling summaries of long histories: the older messages of a summarised namespace are folded into one summary
by the summary model, at save, keeping the newest messages verbatim and never separating a tool call from its
results."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from picoflow import telemetry
from picoflow.conversation.memory import SummaryConfig
from picoflow.deadline import within_turn
from picoflow.errors import CompactionError
from picoflow.messages import add_usage, content_text
from picoflow.models.calls import model_call_for

if TYPE_CHECKING:
    from picoflow.authoring.flow import Flow
    from picoflow.models.registry import ModelSelection, ProviderRegistry

# Time kept for the save when compaction runs near the deadline: the summary calls stop this much before it.
SAVE_RESERVE_SECONDS = 1.0


_SUMMARY_INSTRUCTION = (
    "You maintain the running memory of a conversation between a user and an assistant. "
    "You receive the current summary (possibly empty) and the next messages of the conversation, "
    "which will be removed from the history once you have summarised them. "
    "Reply with one updated, cumulative summary that merges the current summary with the new messages. "
    "Be concise and factual. Keep every name, number, amount, date, choice, decision, commitment and "
    "tool outcome, and list the questions that are still open. When a later message corrects or "
    "replaces an earlier fact, keep only the newer one. Do not invent anything, do not address the user, "
    "and reply with the summary text only."
)


@dataclass
class CompactionResult:
    """The outcome of one compaction.

    ``messages`` is the new namespace list (the original system slot followed by the kept messages),
    ``summary`` the new rolling summary, ``summarized_through_id`` the id of the last message folded
    into it, and ``response`` the summary model's reply (for token accounting).
    """

    messages: list[BaseMessage]
    summary: str
    summarized_through_id: str | None
    response: AIMessage


def _tool_call_ids(message: BaseMessage) -> list[str]:
    if not isinstance(message, AIMessage):
        return []
    return [call_id for call in message.tool_calls if (call_id := call.get("id"))]


def choose_cut(messages: Sequence[BaseMessage], recent_messages: int) -> int:
    """Index of the first message kept verbatim when ``messages`` (slot 0 included) is compacted.

    Aims to keep the ``recent_messages`` newest messages. The cut never separates an AI message
    carrying tool calls from its tool results: it moves earlier to keep the calling message, or, if
    that would keep everything, later past the results. Returns 1 when nothing can be summarised.
    """
    total = len(messages)
    target = total - recent_messages
    if target <= 1:
        return 1

    caller_index: dict[str, int] = {}
    # blocked[c] is True when cutting before index c would split a tool call from one of its results
    blocked = [False] * (total + 1)
    for index, message in enumerate(messages):
        if index == 0:
            continue
        for call_id in _tool_call_ids(message):
            caller_index.setdefault(call_id, index)
        if isinstance(message, ToolMessage):
            caller = caller_index.get(message.tool_call_id)
            if caller is not None:
                for cut in range(caller + 1, index + 1):
                    blocked[cut] = True

    for cut in range(target, 1, -1):
        if not blocked[cut]:
            return cut
    # at least one message must stay verbatim, so the search stops before the end of the list
    for cut in range(target + 1, total):
        if not blocked[cut]:
            return cut
    return 1


def orphan_tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    """Tool messages whose ``tool_call_id`` was not issued by an earlier AI message in ``messages``."""
    issued: set[str] = set()
    orphans: list[ToolMessage] = []
    for message in messages:
        issued.update(_tool_call_ids(message))
        if isinstance(message, ToolMessage) and message.tool_call_id not in issued:
            orphans.append(message)
    return orphans


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _render_transcript(summarised: Sequence[BaseMessage], tool_names: dict[str, str]) -> str:
    lines: list[str] = []
    for message in summarised:
        text = content_text(message.content).strip()
        if isinstance(message, HumanMessage):
            lines.append(f"User: {text}")
        elif isinstance(message, AIMessage):
            if text:
                lines.append(f"Assistant: {text}")
            for call in message.tool_calls:
                lines.append(f"Assistant called tool {call['name']} with {_json(call.get('args', {}))}")
        elif isinstance(message, ToolMessage):
            name = message.name or tool_names.get(message.tool_call_id) or "unknown"
            lines.append(f"Tool {name} returned: {text}")
        elif isinstance(message, SystemMessage):
            lines.append(f"System: {text}")
        else:
            lines.append(f"{message.type}: {text}")
    return "\n".join(lines)


def build_summary_request(
    summarised: Sequence[BaseMessage], previous_summary: str | None, *, context: Sequence[BaseMessage] = ()
) -> list[BaseMessage]:
    """The messages sent to the summary model to fold ``summarised`` into ``previous_summary``.

    ``context`` is only used to resolve tool names of results whose message carries none.
    """
    tool_names: dict[str, str] = {}
    for message in (*context, *summarised):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                call_id = call.get("id")
                if call_id:
                    tool_names[call_id] = call["name"]
    previous = (previous_summary or "").strip() or "(none yet)"
    request = (
        f"Current summary:\n{previous}\n\n"
        f"Messages to fold into the summary, oldest first:\n{_render_transcript(summarised, tool_names)}\n\n"
        "Write the updated summary."
    )
    return [SystemMessage(content=_SUMMARY_INSTRUCTION), HumanMessage(content=request)]


async def compact_history(
    messages: Sequence[BaseMessage],
    *,
    previous_summary: str | None,
    model: BaseChatModel,
    config: SummaryConfig,
    force: bool = False,
    selection: ModelSelection | None = None,
) -> CompactionResult | None:
    """Fold the older messages of one namespace into its rolling summary.

    Returns None when the namespace holds fewer than ``config.min_messages`` messages, its system slot
    counted (unless ``force``), or when no cut can keep tool calls together with their results. Errors of
    the summary model propagate; an empty summary raises ``CompactionError``. ``selection`` (the model's)
    names the call's trace span.
    """
    if len(messages) <= 1:
        return None
    if not force and len(messages) < config.min_messages:
        return None
    cut = choose_cut(messages, config.recent_messages)
    if cut <= 1:
        return None

    summarised = list(messages[1:cut])
    request = build_summary_request(summarised, previous_summary, context=messages)
    with model_call_for("summary", None), telemetry.model_call(selection, "summary", None, request) as traced:
        response = traced.answered(await model.ainvoke(request))
    summary = content_text(response.content).strip()
    if not summary:
        raise CompactionError("The summary model returned an empty summary.")
    if not isinstance(response, AIMessage):
        response = AIMessage(content=response.content, id=response.id)
    return CompactionResult(
        messages=[messages[0], *messages[cut:]],
        summary=summary,
        summarized_through_id=summarised[-1].id,
        response=response,
    )


async def compact(flow: Flow, providers: ProviderRegistry, *, force: bool) -> bool:
    """Fold the older messages of each summarised namespace into its rolling summary; True when one changed."""
    memory = flow.run_context.memory
    if memory.summary_model is None or not memory.summary_namespaces:
        return False
    compacted = False
    for name in sorted(memory.summary_namespaces & set(memory.names())):
        space = memory.namespace(name)
        try:
            model = providers.chat_model(memory.summary_model)
            result = await within_turn(
                compact_history(
                    space.messages,
                    previous_summary=space.summary,
                    model=model,
                    config=memory.summary_config,
                    force=force,
                    selection=memory.summary_model,
                ),
                reserve=SAVE_RESERVE_SECONDS,
            )
        except Exception as exc:  # noqa: BLE001 - compaction must never fail the turn
            flow.logger.warn(f"Memory compaction skipped: {type(exc).__name__}: {exc}", namespace=name)
            continue
        if result is None:
            continue
        add_usage(flow.run_context.require_doc().tokens, result.response)
        space.messages[:] = result.messages
        space.summary = result.summary
        space.summarized_through_id = result.summarized_through_id
        compacted = True
    return compacted
