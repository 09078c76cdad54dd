"""What ``picoflow serve`` warns of at start: registered flows whose model provider lacks a setting.

Such a flow's turns answer ``503 MODEL_NOT_CONFIGURED`` until the setting is given; the warning says so before
the first user finds out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from picoflow.authoring.flow import Flow
from picoflow.aws.discovery import FLOWS_VARIABLE, load_flows
from picoflow.aws.priming import model_selections
from picoflow.aws.runtime import engine_environment
from picoflow.models.factory import default_registry
from picoflow.models.registry import ProviderRegistry


def unconfigured_models(flows: Iterable[type[Flow]], registry: ProviderRegistry) -> list[str]:
    """One sentence per registered flow and model provider that cannot build a model: which setting is missing.

    Nothing when the registry serves every selection from an override (``PICOFLOW_SCRIPT``). A flow whose
    models are chosen per request (from its config) is not checked: its first turn tells.
    """
    if registry.override is not None:
        return []
    warnings: list[str] = []
    for flow_cls in flows:
        for provider_name in dict.fromkeys(selection.provider for selection in model_selections(flow_cls)):
            if provider_name not in registry.names():
                problem: str | None = "is not registered"
            else:
                missing = registry.get(provider_name).missing_setting()
                problem = None if missing is None else f"has no {missing}"
            if problem is not None:
                warnings.append(
                    f"Flow {flow_cls.id} uses model provider '{provider_name}', which {problem}: "
                    "its turns answer 503 MODEL_NOT_CONFIGURED until that is fixed."
                )
    return warnings


def startup_warnings(environ: Mapping[str, str]) -> list[str]:
    """``unconfigured_models`` for the flows and providers the handler builds from ``environ``."""
    env = engine_environment(environ)
    return unconfigured_models(load_flows(env.get(FLOWS_VARIABLE)), default_registry(env))
