"""The turn's loop: open the turn, settle waiting approvals, then drive the executing step hop by hop until it
answers.

Each hop is a logic step's decision or one model call (``picoflow.turn.model_call``) whose tool calls are
dispatched (``picoflow.turn.tool_dispatch``) or whose answer is read as a reply or a route
(``picoflow.turn.cursor``); a hop ends in a typed outcome, answered or going on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from picoflow import telemetry
from picoflow.authoring.flow import Flow
from picoflow.authoring.step import LogicStep, Step
from picoflow.authoring.step_registry import collect_steps
from picoflow.authoring.transitions import as_transition
from picoflow.errors import ApprovalNotPendingError, PicoFlowError
from picoflow.files.refs import with_files
from picoflow.messages import (
    CONTINUE_PREFIX,
    AiMessageEx,
    HumanMessageEx,
    as_text,
    content_text,
    gen_message_id,
    is_direct,
)
from picoflow.models.registry import ModelSelection, ProviderRegistry
from picoflow.results import RunResponse
from picoflow.session import approvals as records
from picoflow.session.approvals import Decision
from picoflow.turn import approvals
from picoflow.turn.cursor import Reply, apply_transition, deliver_direct, executing_step, read_answer
from picoflow.turn.hop import Hop, open_hop
from picoflow.turn.model_call import ModelCall, call_model
from picoflow.turn.tool_dispatch import calls_table, dispatch_tools, shown_arguments

MAX_HOPS_PER_TURN = 64


async def prepare_flow(flow_cls: type[Flow], config: dict[str, Any] | None, providers: ProviderRegistry) -> Flow:
    """A new ``flow_cls`` for one turn: the request config in its context, ``init()`` run, its steps collected and
    every model it would call checked against ``providers``."""
    flow = flow_cls()
    if config is not None:
        flow.add_context({"config": config})
    await flow.init()
    collect_steps(flow)
    providers.validate(flow.model_selection())
    for step in flow.get_steps():
        if not step.is_logic():
            providers.validate(step.model_selection())
    return flow


async def answer_turn(flow: Flow, user_message: str | None, request_id: str,
                      decisions: tuple[Decision, ...] = (), caller: str | None = None) -> RunResponse:
    """Run one turn of a bound flow and answer it: the current step opens the turn (``on_start`` for a new session,
    its opener joining the history, else ``on_restore``), a batch flow saves first, the user's decisions on waiting
    tool calls are taken and settled, then the steps run."""
    context = flow.run_context
    step = executing_step(flow)
    if context.require_doc().revision == 0:
        opener = await step.on_start()
        if opener is not None:
            step.get_memory().append(opener)
    else:
        await step.on_restore()
    if flow.is_batch():
        await context.require_services().save()
    extra, finish = await settle_approvals(flow, decisions, approver="user", decided_by=caller)
    if extra is not None and is_direct(extra) and not user_message:
        # An approved handler answered in code: that is the reply, unless the user also said something.
        message: Any = deliver_direct(executing_step(flow), extra, finish)
    else:
        if extra is not None:
            executing_step(flow).get_memory().append(extra)
        message = await run_turn(flow, user_message)
    return _answered(flow, message, request_id)


async def answer_review(flow: Flow, decisions: tuple[Decision, ...], reviewer: str, request_id: str) -> RunResponse:
    """A reviewer's decision on a waiting call, settled at once (the approved tool runs in this request); the
    model answers on the user's next turn."""
    extra, finish = await settle_approvals(flow, decisions, approver="reviewer", decided_by=reviewer)
    message = deliver_direct(executing_step(flow), extra, finish) if extra is not None and is_direct(extra) else ""
    if extra is not None and not is_direct(extra):
        executing_step(flow).get_memory().append(extra)
    return _answered(flow, message, request_id)


def _answered(flow: Flow, message: Any, request_id: str) -> RunResponse:
    doc = flow.run_context.require_doc()
    current = executing_step(flow)
    return RunResponse(success=True, completed=current.is_end(), message=message, session=doc.id,
                       content_type=current.content_type, request_id=request_id,
                       pending_approvals=records.pending(doc))


async def settle_approvals(flow: Flow, decisions: tuple[Decision, ...], *, approver: str,
                           decided_by: str | None) -> tuple[BaseMessage | None, bool]:
    """Expire overdue waiting calls, record ``decisions`` and claim them in one conditional write, then settle every
    decided call nobody else is settling; the direct message an approved handler answered with, if any."""
    doc = flow.run_context.require_doc()
    if not doc.approvals:
        if decisions:
            raise ApprovalNotPendingError("The call is not waiting for a decision.")
        return None, False
    records.expire(doc)
    decided = records.decide(doc, decisions, approver=approver, decided_by=decided_by, owner=doc.owner)
    due = records.lapsed(records.unsettled(doc))
    if decided or any(approval.status == "approved" for approval in due):
        # The decision is written before anything runs: of two racing for one call, only one write lands.
        records.claim(due)
        await flow.run_context.require_services().save()
    return await approvals.settle(flow, due, functools.partial(_run_approved, flow))


async def _run_approved(flow: Flow, step: Step, ai: AiMessageEx,
                        key: str) -> tuple[list[BaseMessage], BaseMessage | None, bool]:
    """Run an approved call on the step that made it (moving the cursor back to it if the conversation moved on)."""
    if flow.get_current_step() is not step:
        await flow.goto(step.id)
    offer = ModelCall.read(open_hop(flow))
    tools = await dispatch_tools(offer.hop, ai, offer, calls_table(offer.hop, ai, offer), approved_key=key)
    return tools.messages, tools.extra, tools.finish


async def run_turn(flow: Flow, user_message: str | None) -> Any:
    """Run the current step (and whatever it routes to) for one user message; return the reply."""
    step = executing_step(flow)
    if flow.is_batch_coordinator():
        return await flow.spawn_steps()
    return await step.run(user_message)


async def run_model_loop(step: Step, user_message: str | None) -> Any:
    """The default ``Step.run``: drive the executing step from ``user_message`` until it answers.

    The files attached to the turn join the first message built from the user's input, unless the step
    declines them (``Step.accepts_attachments``).
    """
    flow = step.flow
    attached = flow.run_context.files.take_attached() if step.accepts_attachments() else []
    content = with_files(user_message, attached) if attached else user_message
    pending: BaseMessage | None = HumanMessageEx(step.id, content) if content else None
    prior: str | None = None
    fallback: tuple[str, ModelSelection] | None = None
    with telemetry.step_runs():
        for _ in range(MAX_HOPS_PER_TURN):
            hop = open_hop(flow)
            step = hop.step
            telemetry.step_run(step)
            if prior is not None and step.id != prior:
                if flow.checkpoint_on_crossing and not hop.nested:
                    await flow.checkpoint()
                if hop.sink is not None:
                    hop.sink.progress("step", step.id)
                pending = step.on_crossing(pending, prior)
            prior = step.id
            if step.is_logic():
                outcome = await _logic_hop(hop, pending)
            else:
                kept = fallback[1] if fallback is not None and fallback[0] == step.id else None
                outcome = await _model_hop(hop, pending, kept)
                if outcome.fallback is not None:
                    fallback = (step.id, outcome.fallback)
            if isinstance(outcome, _Answered):
                return outcome.value
            pending = outcome.pending
    raise PicoFlowError(f"Flow '{flow.id}' moved between steps more than {MAX_HOPS_PER_TURN} times in one turn.")


@dataclass(frozen=True)
class _Answered:
    """The hop answered the turn with ``value``."""

    value: Any
    fallback: ModelSelection | None = None


@dataclass(frozen=True)
class _Again:
    """The hop moved on (or stays for another model call) with ``pending`` as the next step's incoming message."""

    pending: BaseMessage | None
    fallback: ModelSelection | None = None


async def _logic_hop(hop: Hop, pending: BaseMessage | None) -> _Answered | _Again:
    step = hop.step
    if not isinstance(step, LogicStep):
        raise PicoFlowError(f"Step '{step.id}': is_logic() is True only for a LogicStep; subclass LogicStep.")
    handover = pending or HumanMessageEx(step.id, f"{CONTINUE_PREFIX}{step.id}", origin="framework")
    hop.space.messages.append(handover)
    transition = as_transition(await step.run_logic())
    if transition is None:
        raise PicoFlowError(f"Logic step '{step.id}' must return a step or a transition.")
    message = transition.message
    answer_now = message if message is not None and is_direct(message) else None
    # A direct answer ends the turn, so a logic step may keep the cursor with one; anything else would loop.
    if transition.step == step.id and answer_now is None:
        raise PicoFlowError(
            f"Logic step '{step.id}' must move the cursor to another step or answer with direct_to(...)."
        )
    destination = await apply_transition(hop, transition)
    if answer_now is not None:
        return _Answered(deliver_direct(destination, answer_now, transition.finish))
    return _Again(transition.message)


async def _model_hop(hop: Hop, pending: BaseMessage | None, fallback: ModelSelection | None) -> _Answered | _Again:
    """One model call of the hop's step: its tool calls dispatched, or its answer read as a reply or a route."""
    step = hop.step
    memory = hop.space.messages
    if pending is not None:
        memory.append(pending)
    offer = ModelCall.read(hop)
    outcome = await call_model(offer, fallback)
    if outcome.ai is None:
        read = read_answer(hop.flow, outcome.answer)
        model_text = None
    else:
        ai = outcome.ai.model_copy(update={"id": gen_message_id(step.id)})
        if ai.tool_calls and outcome.parsed is None:
            return await _tool_hop(offer, ai, outcome.fallback)
        result = outcome.parsed if outcome.parsed is not None else content_text(ai.content)
        read = read_answer(hop.flow, await step.on_response(result), model_said=result)
        model_text = content_text(ai.content) or as_text(outcome.parsed)
    if isinstance(read, Reply):
        memory.append(AiMessageEx(step.id, read.text))
        return _Answered(read.text, outcome.fallback)
    if model_text is not None:
        memory.append(AiMessageEx(step.id, model_text))
    transition = read.transition
    destination = await apply_transition(hop, transition)
    if transition.message is not None and is_direct(transition.message):
        return _Answered(deliver_direct(destination, transition.message, transition.finish), outcome.fallback)
    return _Again(transition.message, outcome.fallback)


async def _tool_hop(offer: ModelCall, ai: AIMessage, fallback: ModelSelection | None) -> _Answered | _Again:
    hop = offer.hop
    table = calls_table(hop, ai, offer)
    shown: dict[str, dict[str, Any]] = {}
    if hop.sink is not None:
        shown = shown_arguments(hop, ai, offer, table) if hop.sink.details else {}
        hop.sink.tools_called(ai.tool_calls, shown)
    tools = await dispatch_tools(hop, ai, offer, table)
    if shown and hop.sink is not None:
        hop.sink.tools_answered(tools.messages, shown)
    # The call and its results are stored together, after whatever the handlers did: a nested
    # child sharing this namespace must never send a tool call whose results are not there yet.
    hop.space.messages.extend([ai, *tools.messages])
    if tools.result is not None:
        return _Answered(tools.result.value, fallback)
    if tools.extra is not None and is_direct(tools.extra):
        return _Answered(deliver_direct(tools.destination or hop.step, tools.extra, tools.finish), fallback)
    if tools.paused:
        # A call waits for a person: the turn ends here and commits with the call pending.
        return _Answered(content_text(ai.content), fallback)
    return _Again(tools.extra, fallback)
