"""Effect tools run once per turn: the first attempt journals what the handler did, every retry replays it.

``once`` wraps the call of an effect handler (``@tool(effect=True)`` and its kin). It derives the call's key
(``TurnJournal.key``), replays the outcome recorded under it when there is one, and otherwise runs the handler and
records its outcome in one conditional write before the turn goes on. The recorded outcome is what the handler
did to the session, in stored form: the value it returned (a transition, a worker's direct result, or nothing)
and the changes it made to step states and the flow context (keys set or removed, items appended). Replaying
applies those changes, and only those, and returns the same value, so the rest of the turn (the tool message the
model reads, the route taken) is what the first attempt saw, and what other effects of the retried turn changed
stays.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from picoflow.authoring.flow import Flow
from picoflow.authoring.step import Step
from picoflow.authoring.transitions import DirectResult, Transition, as_transition
from picoflow.conversation.state import TRANSIENT_KEY
from picoflow.errors import PicoFlowError
from picoflow.messages import from_message_doc, to_message_doc
from picoflow.session.document import MessageDoc
from picoflow.session.journal import TurnJournal

#: What the session log says of a call whose handler ran and was journaled, and of one replayed from the journal.
JOURNALED = "effect journaled"
REPLAYED = "effect replayed"


async def once(flow: Flow, step: Step, calls: list[dict[str, Any]],
               run: Callable[[Mapping[str, str]], Awaitable[Any]], *, key: str | None = None) -> Any:
    """The outcome of the effect handler of ``calls`` (validated, as the handler gets them): replayed from the
    journal when this turn already ran it, else ``run(keys)``'s (``keys``: each call's journal key, by call id,
    for ``tool_idempotency_key()``), journaled before it is returned.

    ``key`` journals the calls under a key of the caller's (an approved call's, the same in every request that
    may settle it) instead of one derived from this turn.
    """
    journal = _journal(flow)
    if key is not None:
        keys = {call.get("id") or "": key for call in calls}
    else:
        keys = {call.get("id") or "": journal.key(step.id, call["name"], call.get("args") or {}) for call in calls}
        if len(calls) == 1:
            key = next(iter(keys.values()))
        else:
            key = journal.key(step.id, "@tools", [[call["name"], call.get("args") or {}] for call in calls])
    names = [call["name"] for call in calls]
    ids = [call.get("id") or "" for call in calls]
    recorded = await journal.recorded(key)
    if recorded is not None:
        flow.logger.log(REPLAYED, step=step.id, tools=names, toolCallIds=ids)
        return _replay(flow, step, recorded)
    before = _session_state(flow, step)
    returned = await run(keys)
    outcome = _outcome(flow, step, before, returned)
    if outcome is None:
        # Not a value a handler may return: the turn reports that defect, and nothing is worth replaying.
        return returned
    await journal.record(key, outcome)
    flow.logger.log(JOURNALED, step=step.id, tools=names, toolCallIds=ids)
    return returned


def _journal(flow: Flow) -> TurnJournal:
    journal = flow.run_context.require_services().journal
    if journal is None:
        raise PicoFlowError("This turn has no effect journal, so it cannot run effect tools.")
    return journal


def _session_state(flow: Flow, step: Step) -> dict[str, Any]:
    """What an effect handler may change besides its answer: each step's durable state and the flow context."""
    context = flow.run_context
    states = {
        step_id: _durable(context.state_of(step if step_id == step.id else registered))
        for step_id, registered in context.steps.items()
    }
    return {"states": states, "context": copy.deepcopy(context.values)}


def _durable(state: dict[str, Any]) -> dict[str, Any]:
    return {name: copy.deepcopy(value) for name, value in state.items() if name != TRANSIENT_KEY}


def _outcome(flow: Flow, step: Step, before: dict[str, Any], returned: Any) -> dict[str, Any] | None:
    """The stored form of what the handler did, or None when it returned something no handler may return.

    State and context are kept as the changes the handler made (``changes``), not as whole values: a replay
    applies only those, so what another effect of the same turn changed meanwhile is kept.
    """
    after = _session_state(flow, step)
    states = {
        name: ops for name, state in after["states"].items()
        if (ops := changes(before["states"].get(name, {}), state))
    }
    outcome: dict[str, Any] = {"stateChanges": states}
    context_ops = changes(before["context"], after["context"])
    if context_ops:
        outcome["contextChanges"] = context_ops
    if returned is None:
        outcome["kind"] = "none"
    elif isinstance(returned, DirectResult):
        outcome.update(kind="result", value=returned.value)
    else:
        transition = as_transition(returned)
        if transition is None:
            return None
        outcome.update(kind="transition", transition=_stored_transition(transition))
    return outcome


def changes(before: Any, after: Any, path: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The operations that turn ``before`` into ``after``: ``set`` and ``remove`` of object keys, ``append`` of
    items to a list that only grew, ``set`` of anything else that changed (JSON values, by path)."""
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict[str, Any]] = [{"op": "remove", "path": [*path, key]} for key in before if key not in after]
        for key, value in after.items():
            if key in before:
                ops.extend(changes(before[key], value, (*path, key)))
            elif isinstance(value, (dict, list)) and value:
                # A list or object the handler started is its items or keys added: another effect of the same
                # turn may have started the same one, and a replay must add to it rather than replace it.
                ops.extend(changes(type(value)(), value, (*path, key)))
            else:
                ops.append({"op": "set", "path": [*path, key], "value": copy.deepcopy(value)})
        return ops
    if isinstance(before, list) and isinstance(after, list) and after[: len(before)] == before:
        return [{"op": "append", "path": list(path), "items": copy.deepcopy(after[len(before):])}]
    return [{"op": "set", "path": list(path), "value": copy.deepcopy(after)}]


def apply_changes(target: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """Apply ``changes`` to ``target`` in place; a path whose parent no longer exists is created."""
    for op in ops:
        *parents, last = op["path"] or [None]
        node: Any = target
        for key in parents:
            child = node.get(key) if isinstance(node, dict) else None
            if not isinstance(child, (dict, list)):
                child = {}
                node[key] = child
            node = child
        if op["op"] == "remove":
            if isinstance(node, dict):
                node.pop(last, None)
        elif op["op"] == "append":
            current = node.get(last) if last is not None and isinstance(node, dict) else None
            if isinstance(current, list):
                current.extend(copy.deepcopy(op["items"]))
            elif last is not None:
                node[last] = copy.deepcopy(op["items"])
        elif last is not None:
            node[last] = copy.deepcopy(op["value"])


def _stored_transition(transition: Transition) -> dict[str, Any]:
    message = transition.message
    return {
        "step": transition.step,
        "tool": transition.tool,
        "message": None if message is None else to_message_doc(message).model_dump(mode="json"),
        "messageId": None if message is None else message.id,
        "prompt": transition.prompt,
        "state": transition.state,
        "contentType": transition.content_type,
        "finish": transition.finish,
    }


def _replay(flow: Flow, step: Step, recorded: dict[str, Any]) -> Any:
    """Apply a journaled outcome's session changes and return the value the handler returned."""
    context = flow.run_context
    for step_id, ops in recorded.get("stateChanges", {}).items():
        owner: Any = step if step_id == step.id else context.steps.get(step_id)
        if owner is None:
            continue
        context.view(flow).record_write(owner, sorted({str(op["path"][0]) for op in ops if op["path"]}))
        apply_changes(context.state_of(owner), ops)
    apply_changes(context.values, recorded.get("contextChanges", []))
    kind = recorded.get("kind")
    if kind == "result":
        return DirectResult(copy.deepcopy(recorded.get("value")))
    if kind == "transition":
        return _transition(recorded["transition"])
    return None


def _transition(stored: dict[str, Any]) -> Transition:
    message = None
    if stored.get("message") is not None:
        message = from_message_doc(MessageDoc.model_validate(stored["message"]))
        # A message made without an id (``finish`` outside a handler) gets one when it is delivered.
        message.id = stored.get("messageId")
    return Transition(
        step=stored["step"],
        tool=stored.get("tool"),
        message=message,
        prompt=stored.get("prompt"),
        state=stored.get("state"),
        content_type=stored.get("contentType"),
        finish=bool(stored.get("finish")),
    )
