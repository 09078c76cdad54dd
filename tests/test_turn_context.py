"""What a running turn carries per task, and how far its type references reach.

A turn is handed its context; what must still travel with an asyncio task (flow code and provider clients call
back without it) lives in at most four context variables, each saying why. Type-checking imports may name a
type from anywhere, but outside the four authoring modules none of them points back up the layers.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from picoflow.authoring.transitions import handled_tool_call, handling, handling_step, journaled_key
from picoflow.deadline import current_deadline, current_scope, time_left, turn_deadline
from picoflow.errors import TurnDeadlineError
from picoflow.events import EventSink, TurnEvent
from picoflow.models.calls import model_call_for
from picoflow.results import RunResponse
from tests.test_architecture import cycles, imported_modules, module_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "picoflow"
MAX_CONTEXT_VARS = 4
AUTHORING_CORE = {
    "picoflow.authoring.flow", "picoflow.authoring.step", "picoflow.authoring.run_context",
    "picoflow.authoring.transitions",
}


def test_type_references_circle_only_through_the_authoring_core() -> None:
    modules = module_files()
    graph = {name: imported_modules(name, path, modules, type_checking=True) - {name}
             for name, path in modules.items()}
    circles = cycles(graph)
    assert all(set(group) <= AUTHORING_CORE for group in circles), circles


def test_at_most_four_context_variables_each_with_its_reason() -> None:
    declared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if re.search(r"\bContextVar\(", line):
                comment = []
                for above in reversed(lines[:number]):
                    if not above.startswith("#"):
                        break
                    comment.insert(0, above)
                declared.append((path.relative_to(ROOT), " ".join(comment)))
    assert 0 < len(declared) <= MAX_CONTEXT_VARS, declared
    for where, comment in declared:
        assert "A ContextVar because" in comment, where


# -- what each task carries ---------------------------------------------------------------------------


def test_a_model_call_keeps_the_turns_deadline_and_adds_its_own() -> None:
    turn_end = time.monotonic() + 60
    with turn_deadline(turn_end):
        with model_call_for("summary", "Greet", timeout=5):
            scope = current_scope()
            assert (scope.purpose, scope.step, scope.turn_deadline) == ("summary", "Greet", turn_end)
            assert scope.call_deadline is not None and scope.call_deadline < turn_end
        assert current_scope().purpose == "chat"
        assert current_scope().call_deadline is None
        assert current_deadline() == turn_end
    assert current_deadline() is None


def test_too_little_time_left_refuses_the_call() -> None:
    with turn_deadline(time.monotonic() + 0.5), pytest.raises(TurnDeadlineError):
        time_left("the model call")


def test_a_handler_inside_an_effect_handler_keeps_its_effect_keys() -> None:
    step = object()
    call = {"id": "call-1", "name": "book"}
    with handling(step, None, {"call-1": "journal-key"}):
        with handling(step, call):
            assert handling_step() is step
            assert handled_tool_call() == call
            assert journaled_key("call-1") == "journal-key"
            assert journaled_key("call-2") is None
        assert handled_tool_call() is None
        assert journaled_key("call-1") == "journal-key"
    assert journaled_key("call-1") is None


def test_nobody_reading_the_turn_gets_only_its_final_event() -> None:
    quiet, live = EventSink(live=False), EventSink()
    response = RunResponse(success=True, completed=False, message="Hello", session="s-1")
    quiet.finish(response)
    live.finish(response)
    assert [event.event for event in _drain(quiet)] == ["committed"]
    assert [event.event for event in _drain(live)] == ["delta", "committed"]


def _drain(sink: EventSink) -> list[TurnEvent]:
    events = []
    while not sink.queue.empty():
        events.append(sink.queue.get_nowait())
    return events
