"""A flow's registered steps and its flow-wide tool registry, collected into its run context and checked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from picoflow.authoring.step_tools import (
    NoArguments,
    ToolSpec,
    class_of,
    exposed_order,
    group_handlers,
    offered_tool_names,
    typed_tool_specs,
)
from picoflow.errors import PicoFlowError


@dataclass(frozen=True)
class ToolDeclaration:
    """One declaration of a tool, as the flow collects them: the spec, who declared it, and how."""

    spec: ToolSpec
    #: Who declared it, for error messages: ``step 'ExploreStep'`` or ``the flow's define_tools()``.
    source: str
    #: Declared by a ``@tool`` handler's signature rather than by a ``ToolSpec`` written out.
    derived: bool = False


def tool_registry(declarations: Iterable[ToolDeclaration], flow_id: str) -> dict[str, ToolSpec]:
    """The flow-wide tool registry: one spec per name, or an error naming both declarations of a clash.

    A typed handler's declaration gives way to another of the same name that has its schema (so a base step's
    typed tool inherited by two registered subclasses is one tool, and a handler annotated with
    ``TerminateSessionStep.TerminateArgs`` reuses that step's definition); a handler taking no arguments gives
    way to any other. Two ``ToolSpec``s written out with one name are a clash, as are two schemas.
    """
    chosen: dict[str, ToolDeclaration] = {}
    for declaration in declarations:
        name = declaration.spec.name
        held = chosen.get(name)
        if held is None or (_gives_way(held, declaration) and not _gives_way(declaration, held)):
            chosen[name] = declaration
        elif not _gives_way(declaration, held):
            raise PicoFlowError(_duplicate_message(name, flow_id, held, declaration))
    return {name: declaration.spec for name, declaration in chosen.items()}


def _gives_way(declaration: ToolDeclaration, other: ToolDeclaration) -> bool:
    """Whether ``declaration``, made by a handler's signature, yields to ``other`` of the same name."""
    schema = declaration.spec.schema
    return declaration.derived and (schema is NoArguments or schema is other.spec.schema)


def _duplicate_message(name: str, flow_id: str, held: ToolDeclaration, clash: ToolDeclaration) -> str:
    return (
        f"Duplicate tool '{name}' registered in flow '{flow_id}': declared by {held.source} (schema "
        f"{held.spec.schema.__name__}) and by {clash.source} (schema {clash.spec.schema.__name__}). Declare the "
        "tool once (in Flow.define_tools() or on a base step the handling steps share) and annotate every "
        "handler with that schema (or let it take no arguments), or rename one of the tools."
    )


def collect_steps(flow: Any) -> None:
    """Register ``flow``'s steps and its flow-wide tool registry in its run context (ids and tool names checked)."""
    context = flow.run_context
    steps: dict[str, Any] = {}
    for step in flow.define_steps():
        if step.id in steps:
            raise PicoFlowError(
                f"Step '{step.id}' is registered twice in flow '{flow.id}': register it once in define_steps(), "
                "or subclass it (with its own id) for a second role."
            )
        steps[step.id] = step
    if not steps:
        raise PicoFlowError(f"Flow '{flow.id}' defines no steps: return at least one step from define_steps().")
    context.steps = steps
    declarations = [ToolDeclaration(spec, "the flow's define_tools()") for spec in flow.define_tools()]
    for step in steps.values():
        derived = set(typed_tool_specs(class_of(step)))
        source = f"step '{step.id}'"
        declarations += [ToolDeclaration(spec, source, spec in derived) for spec in step.define_tools()]
    context.tools = tool_registry(declarations, flow.id)
    for step in steps.values():
        if not step.calls_chat_model:
            _refuse_chat_features(step, [d for d in declarations if d.source == f"step '{step.id}'"])
        for name in offered_tool_names(step):
            if name not in context.tools:
                raise PicoFlowError(
                    f"Tool '{name}' is not defined in flow '{flow.id}': step '{step.id}' offers it. Define it "
                    "with a typed @tool handler or a ToolSpec in define_tools(), or stop offering it."
                )


def _refuse_chat_features(step: Any, declared: list[Any]) -> None:
    """Refuse tools and structured output on a step that answers without a chat model (a decision step)."""
    features = []
    if declared or step.use_tools() or exposed_order(class_of(step)) or group_handlers(class_of(step)):
        features.append("tools")
    if step.struct_output_schema() is not None:
        features.append("struct_output_schema()")
    if features:
        raise PicoFlowError(
            f"Step '{step.id}' answers without a chat model and cannot use {' or '.join(features)}: "
            "use a regular Step when a model must generate text or call tools."
        )
