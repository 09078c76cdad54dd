"""The path one step takes through the framework: HotelFlow's "search" turn traced from ``run_model_loop``.

Run: .venv/bin/python benchmarks/turn_path.py [--write] [--show]

``sys.setprofile`` records every call into and return from a ``picoflow/`` function while
``turn/loop.py:run_model_loop`` runs (its first entry to its last return, the tool call, the MCP search and the
reply included). The path is the sequence of files execution is in, a file repeated back to back counted once:

- stays: the entries of that sequence; files: the distinct files among them;
- returns: stays in a file the path had already left (stays minus files);
- moves up: calls from a file into a file of a higher layer, the layer of a module being how deep it sits in
  the package's import graph (a leaf is 0): a lower module calling back into one that imports it.

Fewer returns mean less back and forth between files: the loop reads what it needs and calls a hook, instead of
a hook asking the context, which asks the step again. ``--write`` rewrites this benchmark's RESULTS.md section.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import picoflow  # noqa: E402
from benchmarks.results import write_section  # noqa: E402
from picoflow.turn import loop  # noqa: E402
from picoflow.turn.hop import Hop  # noqa: E402
from tests.support.search_turn import run_search_turn  # noqa: E402
from tests.test_architecture import import_layers, module_files  # noqa: E402

PACKAGE = str(Path(picoflow.__file__).resolve().parent) + "/"


@dataclass(frozen=True)
class TurnPath:
    """The figures of one traced path."""

    path: list[str]
    moves_up: int

    @property
    def stays(self) -> int:
        return len(self.path)

    @property
    def files(self) -> int:
        return len(set(self.path))

    @property
    def returns(self) -> int:
        return self.stays - self.files


def layers() -> dict[str, int]:
    """Each ``picoflow/`` file (relative path) by its depth in the import graph that runs."""
    depth = import_layers()
    return {str(path.resolve())[len(PACKAGE):]: depth[module] for module, path in module_files().items()}


def trace() -> tuple[TurnPath, TurnPath]:
    """Trace the search turn from ``run_model_loop``'s first entry to its last return: the path of the frames that
    hold the step it runs (as ``self``, an argument, or the hop handed down), and the path of every frame."""
    events: list[tuple[str, Any]] = []  # the frames stay alive, so no two frames of the trace share an id

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "return") and _relative(frame) is not None:
            events.append((event, frame))

    run_search_turn(profile)
    target = loop.run_model_loop.__code__
    marks = [index for index, (_, frame) in enumerate(events) if frame.f_code is target]
    window = range(marks[0], marks[-1] + 1)
    steps = [events[index][1].f_locals["step"] for index in marks if events[index][0] == "call"]
    logical = _logical_calls(events, window, steps)
    depth = layers()
    return follow(logical, depth, held_only=True), follow(logical, depth, held_only=False)


def _relative(frame: Any) -> str | None:
    name = frame.f_code.co_filename if frame is not None else ""
    return name[len(PACKAGE):] if name.startswith(PACKAGE) else None


def _logical_calls(
    events: list[tuple[str, Any]], window: range, steps: list[Any]
) -> list[tuple[str, str | None, str | None, bool]]:
    """Inside ``window``, each frame's entry and final exit (an ``await`` that suspends and resumes is no call, and
    a frame entered before the window is not followed), with its caller's file at entry and whether both hold a
    step of the loop."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for index, (event, frame) in enumerate(events):
        if event == "call":
            first.setdefault(id(frame), index)
        else:
            last[id(frame)] = index
    callers: dict[int, Any] = {}
    holders: set[int] = set()
    logical = []
    for index in window:
        event, frame = events[index]
        key = id(frame)
        if event == "call" and first[key] == index:
            callers[key] = frame.f_back
            if any(_holds(value, step) for value in frame.f_locals.values() for step in steps):
                holders.add(key)
            caller = frame.f_back
            logical.append(("call", _relative(frame), _relative(caller), key in holders))
        elif event == "return" and last.get(key) == index and key in callers:
            caller = callers[key]
            held = key in holders and id(caller) in holders
            logical.append(("return", _relative(frame), _relative(caller), held))
    return logical


def _holds(value: Any, step: Any) -> bool:
    """Whether ``value`` is ``step``, or the hop or model call that hands it down (``Hop.step``,
    ``ModelCall.hop``)."""
    hop = getattr(value, "hop", value)
    return value is step or (isinstance(hop, Hop) and hop.step is step)


def follow(
    events: list[tuple[str, str | None, str | None, bool]], depth: dict[str, int], *, held_only: bool
) -> TurnPath:
    """The path through ``events``: where execution is after each one, back-to-back repeats merged."""
    path: list[str] = []
    moves_up = 0
    for event, here, caller, held in events:
        where = here if event == "call" else caller
        if where is None or (held_only and not held):
            continue
        if event == "call" and caller is not None and depth[here] > depth[caller]:
            moves_up += 1
        if path[-1:] != [where]:
            path.append(where)
    return TurnPath(path, moves_up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite this benchmark's section of RESULTS.md")
    parser.add_argument("--show", action="store_true", help="print the path, one stay a line")
    options = parser.parse_args()
    step_path, every_frame = trace()
    if options.show:
        print("\n".join(step_path.path))
    rows = [("the step's path", step_path), ("every frame", every_frame)]
    body = "| path | stays | files | moves up a layer | returns to a file already left |\n|---|---:|---:|---:|---:|\n"
    body += "".join(f"| {name} | {p.stays} | {p.files} | {p.moves_up} | {p.returns} |\n" for name, p in rows)
    body += f"\nFiles on the step's path: {', '.join(sorted(set(step_path.path)))}."
    print(body)
    if options.write:
        write_section("The path of a step from run_model_loop (turn_path.py)", "python benchmarks/turn_path.py --write",
                      body)


if __name__ == "__main__":
    main()
