"""OpenTelemetry spans of a turn, named and attributed after the GenAI semantic conventions.

A turn is an ``invoke_workflow {flow}`` span; inside it every step run is ``invoke_agent {step}``, every model
call ``chat {model}`` (``picoflow.call.purpose`` tells a step's reply from a decision or a compaction summary)
and every tool call ``execute_tool {tool}``. Spans go through the public OpenTelemetry API only: whatever SDK
the process configures (ADOT in Lambda, or any other) receives them; without one they record nothing.

Spans carry names, ids, models, token counts and outcomes. Message text, prompts, tool arguments and tool
results are added only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``; a session is
named by a digest of its id, never by the id itself.

The names used in the spans live in ``picoflow.telemetry.conventions``; the spans themselves in
``picoflow.telemetry.spans``. Both are importable from here.
"""

from __future__ import annotations

from picoflow.telemetry.conventions import (
    AGENT_NAME as AGENT_NAME,
)
from picoflow.telemetry.conventions import (
    CACHE_READ_TOKENS as CACHE_READ_TOKENS,
)
from picoflow.telemetry.conventions import (
    CACHE_WRITE_TOKENS as CACHE_WRITE_TOKENS,
)
from picoflow.telemetry.conventions import (
    CAPTURE_CONTENT_ENV as CAPTURE_CONTENT_ENV,
)
from picoflow.telemetry.conventions import (
    COMPLETED as COMPLETED,
)
from picoflow.telemetry.conventions import (
    CONVERSATION as CONVERSATION,
)
from picoflow.telemetry.conventions import (
    DECISION_ROUTE as DECISION_ROUTE,
)
from picoflow.telemetry.conventions import (
    ERROR_TYPE as ERROR_TYPE,
)
from picoflow.telemetry.conventions import (
    FINISH_REASONS as FINISH_REASONS,
)
from picoflow.telemetry.conventions import (
    INPUT_MESSAGES as INPUT_MESSAGES,
)
from picoflow.telemetry.conventions import (
    INPUT_TOKENS as INPUT_TOKENS,
)
from picoflow.telemetry.conventions import (
    OPERATION as OPERATION,
)
from picoflow.telemetry.conventions import (
    OUTPUT_MESSAGES as OUTPUT_MESSAGES,
)
from picoflow.telemetry.conventions import (
    OUTPUT_TOKENS as OUTPUT_TOKENS,
)
from picoflow.telemetry.conventions import (
    PROVIDER as PROVIDER,
)
from picoflow.telemetry.conventions import (
    PURPOSE as PURPOSE,
)
from picoflow.telemetry.conventions import (
    REASONING_TOKENS as REASONING_TOKENS,
)
from picoflow.telemetry.conventions import (
    REQUEST_MODEL as REQUEST_MODEL,
)
from picoflow.telemetry.conventions import (
    RESPONSE_ID as RESPONSE_ID,
)
from picoflow.telemetry.conventions import (
    RESPONSE_MODEL as RESPONSE_MODEL,
)
from picoflow.telemetry.conventions import (
    SERVER_ADDRESS as SERVER_ADDRESS,
)
from picoflow.telemetry.conventions import (
    STEP as STEP,
)
from picoflow.telemetry.conventions import (
    TOOL_ARGUMENTS as TOOL_ARGUMENTS,
)
from picoflow.telemetry.conventions import (
    TOOL_CALL_ID as TOOL_CALL_ID,
)
from picoflow.telemetry.conventions import (
    TOOL_NAME as TOOL_NAME,
)
from picoflow.telemetry.conventions import (
    TOOL_RESULT as TOOL_RESULT,
)
from picoflow.telemetry.conventions import (
    TOOL_TYPE as TOOL_TYPE,
)
from picoflow.telemetry.conventions import (
    WORKFLOW_NAME as WORKFLOW_NAME,
)
from picoflow.telemetry.conventions import (
    capture_content as capture_content,
)
from picoflow.telemetry.conventions import (
    provider_name as provider_name,
)
from picoflow.telemetry.conventions import (
    server_address as server_address,
)
from picoflow.telemetry.conventions import (
    session_digest as session_digest,
)
from picoflow.telemetry.spans import (
    ModelCallSpan as ModelCallSpan,
)
from picoflow.telemetry.spans import (
    StepLike as StepLike,
)
from picoflow.telemetry.spans import (
    TurnSpan as TurnSpan,
)
from picoflow.telemetry.spans import (
    conversation as conversation,
)
from picoflow.telemetry.spans import (
    decision_route as decision_route,
)
from picoflow.telemetry.spans import (
    model_call as model_call,
)
from picoflow.telemetry.spans import (
    set_tracer_provider as set_tracer_provider,
)
from picoflow.telemetry.spans import (
    step_run as step_run,
)
from picoflow.telemetry.spans import (
    step_runs as step_runs,
)
from picoflow.telemetry.spans import (
    tool_calls as tool_calls,
)
from picoflow.telemetry.spans import (
    trace_only_context as trace_only_context,
)
from picoflow.telemetry.spans import (
    turn as turn,
)
