"""Running a decision step: ask its provider (attempts, timeouts), check the answers, recover, route."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from picoflow import telemetry
from picoflow.authoring.decision import (
    RESERVED_FACT_KEYS,
    ChatDecisionProvider,
    Choice,
    DecisionContext,
    DecisionErrorContext,
    DecisionProvider,
    DecisionRequest,
    DecisionResult,
    Noul,
    Question,
    Score,
    validate_answers,
)
from picoflow.authoring.decision_step import DecisionStep
from picoflow.authoring.recovery import is_transient_error
from picoflow.authoring.recovery_hooks import first_answer
from picoflow.authoring.run_context import TurnServices, cancellation_signal
from picoflow.authoring.transitions import Transition, as_transition, handling
from picoflow.deadline import time_left
from picoflow.errors import DecisionValidationError, ParallelCancelledError, PicoFlowError
from picoflow.logger import library_log
from picoflow.session.document import DecisionUsage, SessionDoc, TokenUsage


async def decide(step: DecisionStep) -> Transition:
    """Ask ``step``'s provider its questions and return the transition its hooks choose."""
    runtime = step.flow.run_context.require_services()
    config = step.decision_config()
    selection = config.selection
    questions = _questions(step)
    facts = _facts(step)
    conversation = step.flow.get_conversation(step.namespace, step.max_prior_requests)
    request = DecisionRequest(
        step_id=step.id,
        selection=selection,
        questions=_with_guidance(questions, step.get_prompt()),
        state={**facts, **conversation.as_state()},
        timeout_ms=config.timeout_ms,
    )
    provider = _provider(runtime, selection)
    started = time.monotonic()
    outcome, attempts = await _ask(step, runtime, provider, request, config.max_retries)
    if isinstance(outcome, DecisionResult):
        try:
            answers = validate_answers(questions, outcome.answers)
        except DecisionValidationError as exc:
            step.flow.logger.warn("decision answers rejected", step=step.id, error=exc.message)
            outcome = exc
    # What both contexts report of the call, whichever hook hears of it.
    asked = {"request": conversation.request, "prior_requests": conversation.prior_requests, "attempts": attempts}
    if isinstance(outcome, Exception):
        return await _recover(step, outcome, DecisionErrorContext.at(step.id, selection, **asked))
    context = DecisionContext.at(
        step.id,
        selection,
        **asked,
        facts=facts,
        duration_ms=int((time.monotonic() - started) * 1000),
        usage=outcome.usage,
        request_id=outcome.request_id,
    )
    # The decision hooks answer for their step as a tool handler does: direct(text) replies from it.
    with handling(step, None):
        result = await step.on_decision(answers, context)
    transition = _route(step, result, "on_decision()")
    telemetry.decision_route(transition.step)
    return transition


def _questions(step: DecisionStep) -> dict[str, Question]:
    questions = step.define_questions()
    if not isinstance(questions, Mapping) or not questions:
        raise PicoFlowError(f"{type(step).__name__}.define_questions() must return a non-empty dict.")
    for name, question in questions.items():
        if not isinstance(name, str) or not name.strip():
            raise PicoFlowError(f"{type(step).__name__}.define_questions() has a blank question name.")
        if not isinstance(question, Choice | Score | Noul):
            raise PicoFlowError(f"Question '{name}' must be a Choice, Score or Noul.")
    return dict(questions)


def _facts(step: DecisionStep) -> dict[str, Any]:
    facts = step.get_decision_facts()
    owner = f"{type(step).__name__}.get_decision_facts()"
    if facts is None:
        return {}
    if not isinstance(facts, Mapping):
        raise PicoFlowError(f"{owner} must return a dict, not {type(facts).__name__}.")
    reserved = sorted(RESERVED_FACT_KEYS & set(facts))
    if reserved:
        raise PicoFlowError(
            f"{owner} cannot set {', '.join(reserved)}: the framework fills these in from the conversation."
        )
    _check_json(facts, owner)
    copied: dict[str, Any] = json.loads(json.dumps(facts))
    return copied


def _provider(runtime: TurnServices, selection: Any) -> DecisionProvider:
    registered = runtime.decision_providers.get(selection.provider)
    if registered is not None:
        return registered
    # A missing chat provider is a configuration error: raise it here, outside the recovery chain.
    runtime.providers.validate(selection)
    return ChatDecisionProvider(runtime.providers)


async def _ask(
    step: DecisionStep, runtime: TurnServices, provider: DecisionProvider, request: DecisionRequest, retries: int
) -> tuple[DecisionResult | Exception, int]:
    """The provider's result, or the failure that ends the decision, with the number of attempts made."""
    signal = cancellation_signal(step.flow)
    for attempt in range(1, retries + 2):
        if attempt > 1 and runtime.retry_delay:
            await asyncio.sleep(runtime.retry_delay)
        if signal is not None:
            signal.raise_if_cancelled()
        timeout = _attempt_timeout(request.timeout_ms)
        try:
            with telemetry.model_call(request.selection, "decision", step.id) as traced:
                result = await asyncio.wait_for(provider.decide(request), timeout)
                traced.used(result.usage if isinstance(result, DecisionResult) else None)
        except ParallelCancelledError:
            raise
        except DecisionValidationError as exc:
            _tally(step.flow.run_context.require_doc(), exc.usage)
            return exc, attempt
        except Exception as exc:  # noqa: BLE001 - every provider failure is classified below
            if attempt > retries or not _is_transient(provider, exc):
                return exc, attempt
            step.flow.logger.warn("decision attempt failed", step=step.id, attempt=attempt, error=type(exc).__name__)
            continue
        if not isinstance(result, DecisionResult):
            _tally(step.flow.run_context.require_doc(), None)
            problem = f"The decision provider returned {type(result).__name__}, not a DecisionResult."
            return DecisionValidationError(problem), attempt
        _tally(step.flow.run_context.require_doc(), result.usage)
        return result, attempt
    raise AssertionError("unreachable: the last attempt returns")


def _tally(doc: SessionDoc, usage: TokenUsage | None) -> None:
    """Count one observed provider response, and its tokens, in ``decisionUsage`` (apart from the chat ``tokens``)."""
    if doc.decision_usage is None:
        doc.decision_usage = DecisionUsage()
    doc.decision_usage.calls += 1
    if usage is not None:
        doc.decision_usage.add(usage)


def _attempt_timeout(timeout_ms: int | None) -> float | None:
    limits = [timeout_ms / 1000] if timeout_ms else []
    remaining = time_left("the decision call")
    if remaining is not None:
        limits.append(remaining)
    return min(limits) if limits else None


async def _recover(step: DecisionStep, error: Exception, context: DecisionErrorContext) -> Transition:
    try:
        with handling(step, None):
            answer = await first_answer(owner.on_decision_error(error, context) for owner in (step, step.flow))
        transition = None if answer is None else _route(step, answer, "on_decision_error()")
    except Exception as handler_error:
        # The turn fails with the handler's error; the decision failure that started it would be lost otherwise.
        _log_unrecovered(step, error, handler_error)
        raise
    if transition is None:
        raise error
    return transition


def _log_unrecovered(step: DecisionStep, error: Exception, handler_error: Exception) -> None:
    """Record a decision failure whose error handler failed in turn: types only, its text may quote the user."""
    types = {"decisionErrorType": type(error).__name__, "handlerErrorType": type(handler_error).__name__}
    step.flow.logger.error("decision error handler failed", step=step.id, **types)
    library_log.error("Decision error handler failed", extra={"step": step.id, **types})


def _route(step: DecisionStep, result: Any, hook: str) -> Transition:
    where = f"{type(step).__name__}.{hook}"
    if isinstance(result, str) and step.flow.get_step(result.strip()) is None:
        raise PicoFlowError(
            f"{where} returned text that names no registered step ({result[:60]!r}). "
            "Return direct_to(Step, text) to answer with it, or finish(text) to end the session."
        )
    transition = as_transition(result)
    if transition is None:
        raise PicoFlowError(
            f"{where} must return a transition (go, direct_to, finish), a Step class or a step name, "
            f"not {type(result).__name__}."
        )
    return transition


def _with_guidance(questions: Mapping[str, Question], guidance: str | None) -> dict[str, Question]:
    if not guidance:
        return dict(questions)
    return {
        name: question.model_copy(
            update={"instructions": "\n\n".join(p for p in (guidance, question.instructions) if p)}
        )
        for name, question in questions.items()
    }


def _check_json(value: Any, path: str) -> None:
    """Refuse anything that would not survive a JSON round trip unchanged."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PicoFlowError(f"{path} holds a non-finite number; facts must be JSON-compatible.")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PicoFlowError(f"{path} has a non-string key {key!r}; facts must be JSON-compatible.")
            _check_json(item, f"{path}.{key}")
        return
    raise PicoFlowError(f"{path} holds a {type(value).__name__}; facts must be JSON-compatible.")


def _is_transient(provider: DecisionProvider, error: Exception) -> bool:
    judge = getattr(provider, "should_retry", None)
    if callable(judge):
        return bool(judge(error))
    return is_transient_error(error)
