"""The project the local tools run: its Lambda handler and flow modules, named on the command line.

Both are found with ``importlib`` from the working directory, as ``python -m`` would: ``--handler
handlers.api:lambda_handler`` and ``--flows flows`` (``PICOFLOW_FLOWS`` when set) by default. A folder without a
``handlers`` package is served by the library's own handler, which is all a project's ``handlers/api.py``
re-exports anyway.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from picoflow.aws.discovery import DEFAULT_FLOW_MODULES, FLOWS_VARIABLE

LambdaHandler = Callable[[dict[str, Any], Any], Any]
#: Runs a ``POST /ai/run`` event as a streamed turn, handing each event to its second argument; False (nothing
#: handed over) when the request is to be refused by the handler instead.
StreamTurn = Callable[[dict[str, Any], Callable[[Any], bool], Any], bool]

DEFAULT_HANDLER = "handlers.api:lambda_handler"
#: What the default handler falls back to where the working directory has no ``handlers`` package.
LIBRARY_HANDLER = "picoflow.aws.api:lambda_handler"


class ProjectError(ValueError):
    """A module or name the command line gave cannot be loaded; the message is one sentence saying what to do."""


def use_working_directory() -> None:
    """Make the project in the working directory (its handlers/ and flows/) importable, as ``python -m`` does."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def default_flows() -> str:
    """The flow modules a tool uses unless told otherwise: ``PICOFLOW_FLOWS``, else ``flows``."""
    return os.environ.get(FLOWS_VARIABLE) or DEFAULT_FLOW_MODULES


def load_handler(spec: str | LambdaHandler = DEFAULT_HANDLER) -> LambdaHandler:
    """The handler named by ``spec`` (``MODULE:ATTR``), or ``spec`` itself when it is already a callable.

    The default, ``handlers.api:lambda_handler``, falls back to ``picoflow.aws.api:lambda_handler`` when the
    working directory has no ``handlers`` package.

    Raises:
        ProjectError: ``spec`` is malformed, its module cannot be imported or has no such callable.
    """
    if callable(spec):
        return spec
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ProjectError(f"A handler is named MODULE:ATTR, e.g. {DEFAULT_HANDLER}; got {spec!r}.")
    use_working_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if spec == DEFAULT_HANDLER and error.name in ("handlers", module_name):
            return load_handler(LIBRARY_HANDLER)
        raise ProjectError(
            f"Cannot import the handler module '{module_name}': no module named '{error.name}' in "
            f"{os.getcwd()} or the installed packages (run the command in your project's folder, or leave "
            "--handler out to use PicoFlow's own handler)."
        ) from error
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise ProjectError(f"The module '{module_name}' has no callable '{attribute}' to serve as the handler.")
    found: LambdaHandler = handler
    return found


def check_flow_modules(modules: str) -> None:
    """Import each of the comma-separated flow ``modules`` now, so a missing one is reported before serving.

    Raises:
        ProjectError: a module cannot be found, in one sentence naming it and where it was looked for.
    """
    use_working_directory()
    for name in (part.strip() for part in modules.split(",") if part.strip()):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not (name == error.name or name.startswith(f"{error.name}.")):
                raise  # the module exists but imports something missing: its own traceback says what
            path = name.replace(".", "/")
            raise ProjectError(
                f"No flow module '{name}': there is no {path}.py or {path}/__init__.py in {os.getcwd()} or the "
                "installed packages; run the command from the folder that holds it."
            ) from error


def handler_streamer(handler: LambdaHandler) -> StreamTurn | None:
    """The ``stream_turn`` its module offers beside ``handler`` (``picoflow.aws.api`` does), if any."""
    module = sys.modules.get(getattr(handler, "__module__", "") or "")
    streamer = getattr(module, "stream_turn", None)
    return streamer if callable(streamer) else None


def protocol_streamer(handler: LambdaHandler) -> StreamTurn | None:
    """The ``stream_protocol`` its module offers beside ``handler`` (``picoflow.aws.api`` does), if any: it streams
    the open protocols' routes (AG-UI), handing it encoded frames, and returns False for any other request."""
    module = sys.modules.get(getattr(handler, "__module__", "") or "")
    streamer = getattr(module, "stream_protocol", None)
    return streamer if callable(streamer) else None
