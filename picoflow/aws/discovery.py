"""Which flows the function serves: the modules named by ``PICOFLOW_FLOWS``, or the installed and bundled ones."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from importlib.metadata import entry_points
from types import ModuleType

from picoflow import Flow

FLOWS_VARIABLE = "PICOFLOW_FLOWS"
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
