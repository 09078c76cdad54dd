"""Transitions: where a handler, a logic step or ``on_response`` sends the turn next (``go``, ``stay``, ``direct``,
``direct_to``, ``finish``), and which handler is running so that ``stay`` and ``direct`` know their step."""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage

from picoflow.errors import PicoFlowError
from picoflow.messages import DirectMessage

if TYPE_CHECKING:
    from picoflow.authoring.step import Step


@dataclass(frozen=True)
class _Handling:
    """The handler running in a task: its step, the single call it handles (None inside a group handler or a
    decision hook), and the journal keys of the effect calls it runs, by call id."""

    step: Step | None = None
    call: Mapping[str, Any] | None = None
    effect_keys: Mapping[str, str] | None = None


# A task running no handler.
_NO_HANDLER = _Handling()
# A ContextVar because stay(), direct(), finish() and tool_idempotency_key() are called by flow code, which is
# handed no context to pass back; a parallel worker's handler runs in its own task.
_handling: contextvars.ContextVar[_Handling] = contextvars.ContextVar(
    "picoflow_handling", default=_NO_HANDLER
)


@contextlib.contextmanager
def _within(handling: _Handling) -> Iterator[None]:
    token = _handling.set(handling)
    try:
        yield
    finally:
        _handling.reset(token)


def handling(step: Step, call: Mapping[str, Any] | None,
             keys: Mapping[str, str] | None = None) -> contextlib.AbstractContextManager[None]:
    """Mark a handler of ``step`` (a tool handler for ``call`` when it handles a single one, or a decision hook)
    as running in the block: ``stay()`` and ``direct()`` answer for that step. ``keys`` are the journal keys of the
    effect calls it handles, by call id, which ``tool_idempotency_key()`` answers; without them a handler keeps
    those of the one it runs inside."""
    current = _handling.get()
    return _within(_Handling(step, call, current.effect_keys if keys is None else keys))


def handling_step() -> Step | None:
    """The step whose tool handler is running in this task, if any."""
    return _handling.get().step


def handled_tool_call() -> Mapping[str, Any] | None:
    """The tool call whose individual handler is running, if any."""
    return _handling.get().call


def journaled_key(call_id: str) -> str | None:
    """The journal key of the effect call ``call_id`` whose handler runs in this task, if it is one."""
    return (_handling.get().effect_keys or {}).get(call_id)


TOOL_VALIDATED = "input validated"


def step_name(target: Any) -> str:
    """Normalise a step class, step or name to the registered name (a step is known by its ``id``)."""
    if isinstance(target, str):
        name = target.strip()
        if not name:
            raise PicoFlowError("go() requires a non-empty Step name.")
        return name
    found = getattr(target, "id", None)
    if isinstance(found, str) and found:
        return found
    raise PicoFlowError("go() requires a Step class with a non-empty id.")


@dataclass(frozen=True)
class Transition:
    """Where to go next and what to apply on the destination; every ``with_*`` returns a new object."""

    step: str
    tool: str | None = None
    message: BaseMessage | None = None
    prompt: str | None = None
    state: dict[str, Any] | None = None
    content_type: str | None = None
    finish: bool = False

    def with_tool_feedback(self, feedback: str) -> Transition:
        """The tool result the model reads for the call that returned this (default ``input validated``)."""
        return replace(self, tool=feedback)

    def with_state(self, state: dict[str, Any]) -> Transition:
        """Save ``state`` on the destination step, as its ``save_state(state)`` would, once the cursor is there.

        The destination is the step this transition goes to: ``go(X).with_state(...)`` writes X's state (hand-over
        of what X owns); ``stay(...)``, ``direct(...)`` and ``finish(...)`` write the executing step's.
        """
        return replace(self, state=dict(state))

    def with_prompt(self, prompt: str) -> Transition:
        """Save ``prompt`` as the destination step's ``_prompt``, which its default ``get_prompt()`` returns."""
        return replace(self, prompt=prompt)

    def with_message(self, message: BaseMessage) -> Transition:
        """Hand ``message`` to the destination step: it opens the step's next model call (after the tool results).

        Crossing into another step, that step's ``on_crossing(message, prior_step)`` receives it first and decides
        what is kept. A ``DirectMessage`` is the reply itself, sent without a model call.
        """
        return replace(self, message=message)

    def with_content_type(self, content_type: str) -> Transition:
        """Set the destination step's response content type (e.g. ``application/json``)."""
        return replace(self, content_type=content_type)


def go(target: Any) -> Transition:
    """Move the cursor to ``target`` (a Step class or a registered step name).

    Args:
        target: The step to enter; it is entered in the same turn and its model answers.

    Returns:
        The transition to return from a tool handler, ``on_response`` or ``run_logic``.

    Raises:
        PicoFlowError: ``target`` is empty, or a class without an id.

    Example:
        ```python
        return go(GreetStep)
        ```
    """
    return Transition(step=step_name(target))


def _handler_step(what: str) -> Step:
    step = handling_step()
    if step is None:
        raise PicoFlowError(f"{what}() can only be returned from inside a running tool handler or decision hook.")
    return step


def stay(feedback: str | None = None) -> Transition:
    """Keep the executing step and send ``feedback`` (default ``input validated``) back to the model.

    Args:
        feedback: The tool result the model reads before it continues.

    Returns:
        The transition to return from a tool handler.

    Example:
        ```python
        return stay("Ask for the family name as well.")
        ```
    """
    step = _handler_step("stay")
    return Transition(step=step.id, tool=feedback or TOOL_VALIDATED)


def direct(content: Any) -> Transition:
    """Answer the caller with ``content`` verbatim and keep the cursor; no further model call this turn.

    Returned from a tool handler, or from a ``DecisionStep``'s ``on_decision``/``on_decision_error``.

    Args:
        content: The answer; anything but a string is sent as JSON.

    Returns:
        The transition to return.

    Example:
        ```python
        return direct("Here are the three hotels side by side: ...")
        ```
    """
    step = _handler_step("direct")
    return Transition(step=step.id, message=DirectMessage(step, content))


def direct_to(target: Any, content: Any) -> Transition:
    """Move the cursor to ``target`` and answer with ``content`` verbatim, without a model call."""
    name = step_name(target)
    return Transition(step=name, message=DirectMessage(name, content))


def finish(content: Any) -> Transition:
    """Complete the session, keep the cursor, and answer with ``content`` verbatim.

    Args:
        content: The last answer of the session; anything but a string is sent as JSON.

    Returns:
        The transition to return from a tool handler or ``run_logic``.

    Example:
        ```python
        return finish("Sorry, members must be 13 or older. Goodbye!")
        ```
    """
    step = handling_step()
    # Outside a handler (on_response, a logic step) the step is known only when the answer is delivered.
    message = DirectMessage(step, content) if step else DirectMessage("", content, id=None)
    # An empty step name keeps the cursor wherever it is.
    return Transition(step="", message=message, finish=True)


@dataclass(frozen=True)
class DirectResult:
    """A worker tool's answer that ends the worker with ``value`` as its output (no further model call)."""

    value: Any


def direct_result(value: Any) -> DirectResult:
    """From a tool handler of a ``run_steps()`` worker: stop that worker and use ``value`` as its output."""
    # Imported here: only run_steps() workers return direct results, and the parallel machinery is theirs.
    from picoflow.authoring.step_runs import check_json

    check_json(value, "The direct_result() value")
    return DirectResult(copy.deepcopy(value))


def as_transition(value: Any) -> Transition | None:
    """Interpret a handler/logic/on_response result as a transition, or ``None`` if it is not one.

    A class with a non-empty string ``id`` (a step class) routes to that step.
    """
    if isinstance(value, Transition):
        return value
    if isinstance(value, str) and value.strip():
        return Transition(step=value.strip())
    name = getattr(value, "id", None) if isinstance(value, type) else None
    if isinstance(name, str) and name:
        return Transition(step=name)
    return None
