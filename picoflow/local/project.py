"""The project the local tools run: its Lambda handler and flow modules, named on the command line.

Both are found with ``importlib`` from the working directory, as ``python -m`` would: ``--handler
handlers.api:lambda_handler`` and ``--flows flows`` (``PICOFLOW_FLOWS`` when set) by default.
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


def use_working_directory() -> None:
    """Make the project in the working directory (its handlers/ and flows/) importable, as ``python -m`` does."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def default_flows() -> str:
    """The flow modules a tool uses unless told otherwise: ``PICOFLOW_FLOWS``, else ``flows``."""
    return os.environ.get(FLOWS_VARIABLE) or DEFAULT_FLOW_MODULES


def load_handler(spec: str | LambdaHandler = DEFAULT_HANDLER) -> LambdaHandler:
    """The handler named by ``spec`` (``MODULE:ATTR``), or ``spec`` itself when it is already a callable."""
    if callable(spec):
        return spec
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"A handler is named MODULE:ATTR, e.g. {DEFAULT_HANDLER}; got {spec!r}.")
    use_working_directory()
    handler: LambdaHandler = getattr(importlib.import_module(module_name), attribute)
    return handler


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
