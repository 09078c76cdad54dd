"""How one ordinary turn travels through the framework: HotelFlow's "search" turn, traced in-process.

The turn (one ``capture_choices`` tool call answered by the MCP search server, then a text reply, and a rolling
summary of the history; ``tests/support/search_turn.py``) runs on the memory store with a replaying chat model,
so the files counted are the framework's own. ``sys.setprofile`` records every Python call into ``picoflow/``.

What is checked is direction, not size: a call that climbs to a module higher in the import graph (a layer up)
only enters a hook of the authoring classes (``flow.py``, ``step.py``) or the turn's own entry point
(``run_model_loop``, which ``Step.run`` reaches through the engine's services). An earlier limit of 12 files
entered per turn is gone: it had drawn the deadline, memory, state paths and the running turn into one module
that everything imported and that imported half the package, a loop at folder scale. Giving each its own
module, and splitting ``step.py`` into the authoring class, tool declarations, transitions and the registry,
puts the turn into more, smaller files whose arrows all point down: 20 for this turn, so the bound is 22.
``benchmarks/turn_path.py`` measures the back and forth of one step's path through them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import picoflow
from tests.support.search_turn import CONVERSATION, SEARCH_TURN, run_search_turn
from tests.test_architecture import import_layers, module_files

PACKAGE = str(Path(picoflow.__file__).resolve().parent) + "/"
#: Where a call may climb a layer: the hooks a flow author overrides, and the model loop ``Step.run`` starts.
CLIMBS_INTO = {"authoring/flow.py", "authoring/step.py", "turn/loop.py:run_model_loop"}


def _trace_search_turn() -> tuple[set[str], Counter[tuple[str, str, str]], str]:
    files: set[str] = set()
    calls: Counter[tuple[str, str, str]] = Counter()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        callee = frame.f_code.co_filename
        if event != "call" or not callee.startswith(PACKAGE):
            return
        files.add(callee[len(PACKAGE):])
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if caller.startswith(PACKAGE) and caller != callee:
            calls[(caller[len(PACKAGE):], callee[len(PACKAGE):], frame.f_code.co_name)] += 1

    message = run_search_turn(profile)
    return files, calls, message


def test_the_search_turn_calls_up_a_layer_only_into_hooks() -> None:
    files, calls, message = _trace_search_turn()

    chat = [reply for reply in CONVERSATION["turns"][SEARCH_TURN]["replies"] if reply.get("for") != "summary"]
    assert [bool(reply.get("tool_calls")) for reply in chat] == [True, False]  # one tool call, then the answer
    assert message == chat[-1]["content"]
    layer = {str(path.resolve())[len(PACKAGE):]: import_layers()[name] for name, path in module_files().items()}
    climbs = {(caller, callee, name) for caller, callee, name in calls if layer[callee] > layer[caller]}
    flow_step_calls = sum(count for (caller, callee, _), count in calls.items() if {caller, callee} == {
        "authoring/flow.py", "authoring/step.py"})
    print(f"\nsearch turn: {len(files)} files of picoflow/ entered, {len({(a, b) for a, b, _ in calls})} caller -> "
          f"callee directions, {sum(calls.values())} cross-file calls, {len(climbs)} calls that climb a layer, "
          f"{flow_step_calls} calls between flow.py and step.py")
    print("files:", ", ".join(sorted(files)))
    assert climbs, "the trace sees the hooks the turn calls"
    stray = sorted(f"{caller} -> {callee}:{name}" for caller, callee, name in climbs
                   if callee not in CLIMBS_INTO and f"{callee}:{name}" not in CLIMBS_INTO)
    assert not stray, "calls that climb a layer into something other than a hook:\n" + "\n".join(stray)
    # telemetry/spans.py, mcp/transport.py and events.py (the turn's spans, the bounded MCP transport, the turn's
    # event stream) join the 20 of the split; one job per module then adds the turn's phases (turn/model_call.py,
    # turn/tool_dispatch.py, turn/cursor.py), the MCP package's declarations, sessions and offers, the providers'
    # vocabulary, the compaction the save runs, the token accounting (usage.py), the reading of older
    # documents (session/legacy.py), where the flow's MCP server is found (mcp/environment.py), the turn's
    # files (files/turn_files.py), the package root, whose finder of moved module paths is asked about any
    # import nothing else finds, a step's registration settings (authoring/step_settings.py) and the hop the
    # turn hands its phases (turn/hop.py).
    assert len(files) <= 38, sorted(files)
    assert flow_step_calls <= 10
