"""The function's logs, metrics and traces (Powertools), and what one turn records in them.

Log lines name a session by ``session_log_id`` only and never carry message text, prompts, tool arguments
or keys. The library's ``picoflow`` logger writes through the same JSON handler, whatever the service name.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.shared.functions import strtobool

from picoflow import RunResponse
from picoflow.logger import LIBRARY_LOGGER_NAME, library_log
from picoflow.telemetry import session_digest

if TYPE_CHECKING:
    from aws_lambda_powertools import Tracer

_CONFLICT_CODES = frozenset({"SESSION_CONFLICT", "SESSION_FLOW_MISMATCH", "SESSION_FLOW_INVARIANT"})

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME") or "picoflow"
logger = Logger(service=SERVICE)
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "PicoFlow", service=SERVICE)
# With service "picoflow" the two are one logger already; any other name would leave library lines unformatted.
if library_log.name != logger.name:
    copy_config_to_registered_loggers(source_logger=logger, include={LIBRARY_LOGGER_NAME})
# Powertools' resolver logs each route's validated arguments (the user's message among them) at DEBUG.
logging.getLogger("aws_lambda_powertools.event_handler").setLevel(logging.INFO)


def _tracer() -> Tracer | None:
    # Powertools' tracer is a no-op outside Lambda, under sam local or when disabled, and needs the optional
    # aws-xray-sdk: only then is the SDK (a fifth of the import time) worth importing.
    wanted = (
        os.environ.get("AWS_LAMBDA_FUNCTION_NAME")
        and not os.environ.get("AWS_SAM_LOCAL")
        and not strtobool(os.environ.get("POWERTOOLS_TRACE_DISABLED") or "false")
        and importlib.util.find_spec("aws_xray_sdk") is not None
    )
    if not wanted:
        return None
    from aws_lambda_powertools import Tracer

    return Tracer(service=SERVICE)


tracer = _tracer()


def cold_start_metric_wanted() -> bool:
    """Whether the handler publishes Powertools' ColdStart metric: not when ``POWERTOOLS_METRICS_DISABLED`` is
    true (the local demo), as Powertools prints that metric whatever the setting says."""
    return not strtobool(os.environ.get("POWERTOOLS_METRICS_DISABLED") or "false")


def session_log_id(session_id: str) -> str:
    """What log lines carry for a session: the digest its trace spans carry as ``gen_ai.conversation.id``."""
    return session_digest(session_id)


def correlate(session_id: str) -> None:
    """Key the invocation's remaining log lines by the session they concern (``session``, a digest).

    ``correlation_id`` stays the API Gateway request id, which joins these lines with the access log.
    """
    logger.append_keys(session=session_log_id(session_id))


def record_turn(flow_name: str, registered: bool, result: RunResponse, latency_ms: float) -> None:
    """Publish a turn's metrics, trace annotation and one log line."""
    # Only registered names become a dimension or annotation: a client-chosen flowName must not mint new series.
    if registered:
        metrics.add_dimension(name="flow", value=flow_name)
        if tracer is not None:
            tracer.put_annotation("flow", flow_name)
    metrics.add_metric(name="Turns", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="TurnLatency", unit=MetricUnit.Milliseconds, value=latency_ms)
    if result.tokens is not None:
        metrics.add_metric(name="InputTokens", unit=MetricUnit.Count, value=result.tokens.input_tokens)
        metrics.add_metric(name="OutputTokens", unit=MetricUnit.Count, value=result.tokens.output_tokens)
        # The share of the input a provider served from its prompt cache, billed at a fraction of the price.
        metrics.add_metric(name="CachedInputTokens", unit=MetricUnit.Count, value=result.tokens.cached_input_tokens)
    if result.replayed:
        metrics.add_metric(name="IdempotentReplays", unit=MetricUnit.Count, value=1)
    if result.session:
        correlate(result.session)
    if not result.success:
        metrics.add_metric(name="TurnFailures", unit=MetricUnit.Count, value=1)
        if result.error_code in _CONFLICT_CODES:
            metrics.add_metric(name="SessionConflicts", unit=MetricUnit.Count, value=1)
    logger.info(
        "Turn finished",
        extra={
            "flow": flow_name if registered else None,
            "success": result.success,
            "completed": result.completed,
            "code": result.error_code,
            "statusCode": result.status_code if not result.success else 200,
            "latencyMs": round(latency_ms, 1),
            # Counts only, for the runbooks' queries of spend by flow.
            "inputTokens": result.tokens.input_tokens if result.tokens is not None else 0,
            "cachedInputTokens": result.tokens.cached_input_tokens if result.tokens is not None else 0,
            "outputTokens": result.tokens.output_tokens if result.tokens is not None else 0,
        },
    )
