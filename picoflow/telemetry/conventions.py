"""What PicoFlow's spans say, in the words of the OpenTelemetry GenAI semantic conventions: the attribute names, the
providers' names and server addresses, a session's digest, and messages and token usage in the conventions' shapes.

Message text is written only with the operator's opt-in (``capture_content``); see ``picoflow.telemetry``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from picoflow.messages import content_text
from picoflow.session.document import TokenUsage

#: Set to ``true`` to record message text, prompts, tool arguments and tool results on the spans.
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
SERVER_ADDRESS = "server.address"
CONVERSATION = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
WORKFLOW_NAME = "gen_ai.workflow.name"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
#: Why a model was called: ``chat`` (a step's reply), ``decision`` (a DecisionStep) or ``summary`` (compaction).
PURPOSE = "picoflow.call.purpose"
STEP = "picoflow.step"
COMPLETED = "picoflow.turn.completed"
DECISION_ROUTE = "picoflow.decision.route"

# The conventions' provider names where PicoFlow's built-in provider names differ from them.
_PROVIDER_NAMES = {
    "bedrock": "aws.bedrock", "google": "gcp.gen_ai", "azure": "azure.ai.openai", "azure-openai": "azure.ai.openai",
}
# Where each built-in provider's requests go unless an endpoint variable says otherwise (``server.address``).
_SERVER_ADDRESSES = {
    "openai": "api.openai.com", "anthropic": "api.anthropic.com", "google": "generativelanguage.googleapis.com",
    "deepseek": "api.deepseek.com", "openrouter": "openrouter.ai",
}
#: LangChain's own ids for a message a provider gave none (``run-...``): not the provider's response id.
LANGCHAIN_IDS = ("run-", "lc_run-")
#: Selection parameters that have a request attribute of their own.
REQUEST_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
}
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def session_digest(session_id: str) -> str:
    """What telemetry and log lines name a session by: a digest, since the id itself lets its holder continue."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:16]


def capture_content() -> bool:
    """Whether spans may carry message text and tool arguments (the operator's explicit opt-in)."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def provider_name(provider: str) -> str:
    """``gen_ai.provider.name`` for a selection's provider."""
    return _PROVIDER_NAMES.get(provider, provider)


def server_address(provider: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``server.address`` of a built-in provider's requests: the host of its endpoint variable when one is set
    (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``, ``AZURE_OPENAI_ENDPOINT`` ...), else its public API's; Bedrock's
    Region endpoint; None for a provider it does not know."""
    env = os.environ if environ is None else environ
    variable = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL", "google": "GOOGLE_BASE_URL",
                "azure-openai": "AZURE_OPENAI_ENDPOINT"}.get(provider)
    configured = (env.get(variable) or "").strip() if variable else ""
    if configured:
        return urlsplit(configured).hostname
    if provider == "bedrock":
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        return f"bedrock-runtime.{region}.amazonaws.com" if region else None
    return _SERVER_ADDRESSES.get(provider)


def usage_attributes(usage: TokenUsage) -> dict[str, Any]:
    """A call's token counts as the conventions' usage attributes."""
    attributes: dict[str, Any] = {INPUT_TOKENS: usage.input_tokens, OUTPUT_TOKENS: usage.output_tokens}
    # The breakdowns only when reported: most calls read or write no cache and do no reasoning.
    for attribute, count in ((CACHE_READ_TOKENS, usage.cached_input_tokens),
                             (CACHE_WRITE_TOKENS, usage.cache_creation_input_tokens),
                             (REASONING_TOKENS, usage.reasoning_tokens)):
        if count:
            attributes[attribute] = count
    return attributes


def text_part(text: str) -> dict[str, Any]:
    """A text part of a message in the conventions' shape."""
    return {"type": "text", "content": text}


def as_message(message: BaseMessage) -> dict[str, Any]:
    """A message in the conventions' ``{role, parts}`` shape."""
    text = content_text(message.content)
    parts: list[dict[str, Any]]
    if isinstance(message, ToolMessage):
        parts = [{"type": "tool_call_response", "id": message.tool_call_id, "result": text}]
    else:
        parts = [text_part(text)] if text else []
    if isinstance(message, AIMessage):
        parts += [{"type": "tool_call", "id": call.get("id"), "name": call["name"], "arguments": call.get("args")}
                  for call in message.tool_calls]
    return {"role": _ROLES.get(message.type, message.type), "parts": parts}


def to_json(value: Any) -> str:
    """The JSON text of an attribute holding messages or arguments."""
    return json.dumps(value, ensure_ascii=False, default=str)
