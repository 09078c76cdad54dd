"""What can be checked of a flow without a request, so a broken configuration fails when the flow is registered.

The flow is built as a turn builds it, without a request's config and without ``init()``. Flow code that cannot
run that way (a step list read from the request's config, say) leaves its part of the check to the first
request, where the same problem answers ``FLOW_SETUP_FAILED``; problems the framework finds in what the flow
declares fail the registration with the flow, the step and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from picoflow.authoring.decision_step import DecisionStep, check_decision_setup
from picoflow.authoring.flow import Flow
from picoflow.authoring.step import Step
from picoflow.authoring.step_registry import collect_steps
from picoflow.authoring.step_tools import class_of, group_handlers, offered_tool_names, tool_handler
from picoflow.authoring.transitions import step_name
from picoflow.errors import PicoFlowError
from picoflow.models.registry import ModelSelection, ProviderRegistry


def check_flow_configuration(flow_cls: type[Flow], providers: ProviderRegistry,
                             decision_providers: Collection[str] = ()) -> None:
    """Raise ``PicoFlowError`` when ``flow_cls`` declares something no request could run.

    Checked: the steps (ids registered twice, none at all), the tools (offered but neither defined nor
    handled, one name declared twice, an MCP allow-list naming a flow tool), the initial step, every model
    selection against ``providers``, and each step's own configuration (a DecisionStep's decision provider and
    model) against ``providers`` and the names of the engine's ``decision_providers``.
    """
    try:
        flow = flow_cls()
        collect_steps(flow)
    except PicoFlowError as exc:
        raise PicoFlowError(f"Flow '{flow_cls.id}' cannot be registered: {exc.message}") from exc
    except NotImplementedError as exc:
        raise PicoFlowError(f"Flow '{flow_cls.id}' cannot be registered: {exc}") from exc
    except Exception:  # noqa: BLE001 - flow code that needs a request: the first request checks it
        return
    _check_initial_step(flow)
    for step in flow.get_steps():
        _check_handlers(flow, step)
        _check_mcp_names(flow, step)
        if isinstance(step, DecisionStep):
            check_decision_setup(step, providers, decision_providers)
    _check_models(flow, providers)


def _declared(flow: Flow, hook: str) -> tuple[bool, Any]:
    """``(True, value)`` of a flow hook, or ``(False, None)`` when it needs a request to answer."""
    try:
        return True, getattr(flow, hook)()
    except PicoFlowError:
        raise
    except NotImplementedError as exc:
        raise PicoFlowError(f"Flow '{flow.id}' cannot be registered: {exc}") from exc
    except Exception:  # noqa: BLE001 - flow code that needs a request: the first request checks it
        return False, None


def _check_initial_step(flow: Flow) -> None:
    known, initial = _declared(flow, "initial_step")
    if not known or initial is None:
        return
    name = step_name(initial)
    if flow.get_step(name) is None:
        registered = ", ".join(step.id for step in flow.get_steps())
        raise PicoFlowError(
            f"Flow '{flow.id}': initial_step() names step '{name}', which define_steps() does not register. "
            f"Register it in define_steps() or start on one of: {registered}."
        )


def _check_handlers(flow: Flow, step: Step) -> None:
    grouped = {name for names in group_handlers(class_of(step)) for name in names}
    for name in offered_tool_names(step):
        if tool_handler(step, name) is None and name not in grouped:
            raise PicoFlowError(
                f"Flow '{flow.id}', step '{step.id}': tool '{name}' is offered to the model but nothing handles it. "
                f"Add a handler to the step (@tool async def {name}(self, args) -> ...) or stop offering it in "
                "use_tools()."
            )


def _check_mcp_names(flow: Flow, step: Step) -> None:
    """Refuse an MCP allow-list naming one of the flow's own tools: flow tools win, so it could never be offered."""
    try:
        offers = step.use_mcp_tools()
    except Exception:  # noqa: BLE001 - step code that needs a request: the offer leaves the tool out then
        return
    for offer in offers:
        for name in offer.tools:
            if flow.get_tool(name) is not None:
                raise PicoFlowError(
                    f"Flow '{flow.id}', step '{step.id}': MCPTools(server='{offer.server}') names '{name}', which is "
                    "one of the flow's own tools; a flow tool always wins over a server's, so that server tool "
                    "would never be offered. Rename the flow's tool or remove the name from the allow-list."
                )


def _check_models(flow: Flow, providers: ProviderRegistry) -> None:
    known, _ = _declared(flow, "model_selection")
    if not known:
        return
    checks: list[tuple[str, Step | None, Callable[[], ModelSelection]]] = [
        ("config_model()", None, flow.model_selection)
    ]
    checks += [("use_model()", step, step.model_selection) for step in flow.get_steps() if not step.is_logic()]
    for where, step, selection in checks:
        try:
            providers.validate(selection())
        except PicoFlowError as exc:
            owner = f"Flow '{flow.id}'" + (f", step '{step.id}'" if step is not None else "")
            raise PicoFlowError(
                f"{owner}: {exc.message} Register the model's provider with the engine "
                f"(FlowEngine(providers=...)) or choose another model in {where}."
            ) from exc
