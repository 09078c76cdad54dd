"""Which flows the function serves (the modules named by ``PICOFLOW_FLOWS``, or the installed and bundled ones),
and the decision providers ``PICOFLOW_DECISION_PROVIDERS`` names."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from picoflow import Flow
from picoflow.errors import PicoFlowError

FLOWS_VARIABLE = "PICOFLOW_FLOWS"
DECISION_PROVIDERS_VARIABLE = "PICOFLOW_DECISION_PROVIDERS"
DEFAULT_FLOW_MODULES = "flows"
ENTRY_POINT_GROUP = "picoflow.flows"


def flow_module_names(modules: str | None = None) -> list[str]:
    """The module names ``load_flows`` imports for ``modules`` (see there)."""
    names = [part.strip() for part in (modules or "").split(",") if part.strip()]
    if names and names != [DEFAULT_FLOW_MODULES]:
        return names
    installed = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name)
    names = [point.module for point in installed]
    if importlib.util.find_spec(DEFAULT_FLOW_MODULES) is not None or not names:
        names.insert(0, DEFAULT_FLOW_MODULES)
    return list(dict.fromkeys(names))


def load_flows(modules: str | None = None) -> list[type[Flow]]:
    """The flow classes defined in the comma-separated ``modules``; a package includes its submodules.

    ``modules`` is ``PICOFLOW_FLOWS``; when that is set, exactly those modules are loaded. Unset (or the
    default, ``flows``), the flows are the installed flow packages plus the application's own: every module
    named by an entry point of the ``picoflow.flows`` group (declared by a flow package, e.g.
    ``[project.entry-points."picoflow.flows"] travel = "travel_flows"`` in its pyproject.toml), then the
    ``flows`` package when one is importable (the application's own). Without either, loading fails.

    A class counts when it subclasses ``Flow``, implements ``config_model`` and is defined in (not
    merely imported into) one of those modules.
    """
    found: list[type[Flow]] = []
    for name in flow_module_names(modules):
        for module in _with_submodules(importlib.import_module(name)):
            found += [flow for flow in _defined_flows(module) if flow not in found]
    return found


def _with_submodules(module: ModuleType) -> list[ModuleType]:
    if not hasattr(module, "__path__"):
        return [module]
    submodules = pkgutil.walk_packages(module.__path__, f"{module.__name__}.")
    return [module, *(importlib.import_module(info.name) for info in submodules)]


def _defined_flows(module: ModuleType) -> list[type[Flow]]:
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Flow)
        and value.__module__ == module.__name__
        and value.config_model is not Flow.config_model
    ]


def load_decision_providers(spec: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The decision providers named by ``spec`` (``PICOFLOW_DECISION_PROVIDERS``), by provider name.

    ``spec`` is comma-separated ``name=module:attribute`` entries, e.g. ``typesafe=my_app.decisions:typesafe``.
    The attribute is a decision provider (an object with ``async decide(request)``), or a factory (a function
    or class) that is called with ``environ`` and returns one. A flow selects it with
    ``config_decision()`` returning ``{"provider": name, "model": ...}``.
    """
    providers: dict[str, Any] = {}
    for entry in (part.strip() for part in (spec or "").split(",")):
        if not entry:
            continue
        name, _, target = (piece.strip() for piece in entry.partition("="))
        module_name, _, attribute = target.partition(":")
        if not name or not module_name or not attribute:
            raise PicoFlowError(f"{DECISION_PROVIDERS_VARIABLE}: '{entry}' is not name=module:attribute.")
        if name in providers:
            raise PicoFlowError(f"{DECISION_PROVIDERS_VARIABLE} names the decision provider '{name}' twice.")
        found = getattr(importlib.import_module(module_name), attribute, None)
        if found is None:
            raise PicoFlowError(f"{DECISION_PROVIDERS_VARIABLE}: module '{module_name}' has no '{attribute}'.")
        provider = found
        if not _is_decision_provider(found) and callable(found):
            try:
                provider = found(environ)
            except Exception as exc:  # noqa: BLE001 - named with the setting, the cause chained
                raise PicoFlowError(
                    f"{DECISION_PROVIDERS_VARIABLE}: the factory '{target}' raised {type(exc).__name__}."
                ) from exc
        if not _is_decision_provider(provider):
            raise PicoFlowError(
                f"{DECISION_PROVIDERS_VARIABLE}: '{target}' is neither a decision provider (an object with an "
                "async decide(request) method) nor a factory returning one."
            )
        providers[name] = provider
    return providers


def _is_decision_provider(value: Any) -> bool:
    return not isinstance(value, type) and callable(getattr(value, "decide", None))
