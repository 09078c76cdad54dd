"""PicoFlow for Python: stateful multi-step LLM conversations as flows of steps.

The root offers the authoring names: flows, steps, tools, transitions, prompts, MCP declarations, the engine,
model selection and the run result. Everything else is imported from its own module: stores and the session
document from ``picoflow.stores``, errors from ``picoflow.errors``, messages from ``picoflow.messages``,
decision and parallel types from ``picoflow.authoring.decision`` and ``picoflow.authoring.step_runs``.

Names load on first use, so ``import picoflow`` imports almost nothing (and never boto3).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from langchain_core.messages import BaseMessage

    from picoflow.authoring.decision_step import DecisionStep
    from picoflow.authoring.flow import Flow
    from picoflow.authoring.prompts import load_prompt, prompt, render
    from picoflow.authoring.step import LogicStep, Step, TerminateSessionStep
    from picoflow.authoring.step_tools import ToolSpec, tool, tools
    from picoflow.authoring.transitions import Transition, direct, direct_to, finish, go, stay
    from picoflow.engine import FlowEngine
    from picoflow.mcp import MCPServerSpec, MCPTools
    from picoflow.models.registry import ModelSelection
    from picoflow.results import RunResponse

    __version__: str

# The module each name is imported from. Names outside ``__all__`` were exported here before they got a home of
# their own: they still resolve, with a DeprecationWarning naming that home, until the next release.
_MODULES: dict[str, str] = {
    "AiMessageEx": "picoflow.messages",
    # The type of the messages hooks such as ``Step.on_crossing`` receive and return: LangChain's own.
    "BaseMessage": "langchain_core.messages",
    "BranchResult": "picoflow.authoring.step_runs",
    "CancellationSignal": "picoflow.authoring.step_runs",
    "ChatDecisionProvider": "picoflow.authoring.decision",
    "Choice": "picoflow.authoring.decision",
    "ChoiceAnswer": "picoflow.authoring.decision",
    "DecisionContext": "picoflow.authoring.decision",
    "DecisionErrorContext": "picoflow.authoring.decision",
    "DecisionProvider": "picoflow.authoring.decision",
    "DecisionRequest": "picoflow.authoring.decision",
    "DecisionResult": "picoflow.authoring.decision",
    "DecisionStep": "picoflow.authoring.decision_step",
    "DecisionValidationError": "picoflow.errors",
    "DirectMessage": "picoflow.messages",
    "DynamoDBSessionStore": "picoflow.stores",
    "Flow": "picoflow.authoring.flow",
    "FlowEngine": "picoflow.engine",
    "HumanMessageEx": "picoflow.messages",
    "InvalidToolArguments": "picoflow.authoring.step_tools",
    "LlmAttemptErrorContext": "picoflow.authoring.recovery",
    "LlmBlockedContext": "picoflow.authoring.recovery",
    "LlmBlockedError": "picoflow.errors",
    "LlmCallPolicy": "picoflow.authoring.recovery",
    "LlmErrorContext": "picoflow.authoring.recovery",
    "LogicStep": "picoflow.authoring.step",
    "MCPServerSpec": "picoflow.mcp",
    "MCPTools": "picoflow.mcp",
    "MemorySessionStore": "picoflow.stores",
    "ModelSelection": "picoflow.models.registry",
    "Noul": "picoflow.authoring.decision",
    "NoulAnswer": "picoflow.authoring.decision",
    "ParallelBatchResult": "picoflow.authoring.step_runs",
    "ParallelCancelledError": "picoflow.errors",
    "ParallelDuplicateKeyError": "picoflow.errors",
    "ParallelExecutionError": "picoflow.errors",
    "ParallelInvocation": "picoflow.authoring.step_runs",
    "ParallelMutationError": "picoflow.errors",
    "ParallelStateConflictError": "picoflow.errors",
    "PicoFlowError": "picoflow.errors",
    "RetryWithModel": "picoflow.authoring.recovery",
    "RunResponse": "picoflow.results",
    "RunStepRequest": "picoflow.authoring.step_runs",
    "SQLiteSessionStore": "picoflow.stores",
    "Score": "picoflow.authoring.decision",
    "ScoreAnswer": "picoflow.authoring.decision",
    "ScriptedDecisionProvider": "picoflow.authoring.decision",
    "SessionConflictError": "picoflow.errors",
    "SessionDoc": "picoflow.stores",
    "SessionFlowInvariantError": "picoflow.errors",
    "SessionFlowMismatchError": "picoflow.errors",
    "SessionLogger": "picoflow.logger",
    "SessionStore": "picoflow.stores",
    "SessionStoreError": "picoflow.errors",
    "SessionTooLargeError": "picoflow.errors",
    "StateChannel": "picoflow.authoring.step_runs",
    "Step": "picoflow.authoring.step",
    "StepChannels": "picoflow.authoring.step_runs",
    "TerminateSessionStep": "picoflow.authoring.step",
    "ToolMessageEx": "picoflow.messages",
    "ToolSpec": "picoflow.authoring.step_tools",
    "Transition": "picoflow.authoring.transitions",
    "direct": "picoflow.authoring.transitions",
    "direct_result": "picoflow.authoring.transitions",
    "direct_to": "picoflow.authoring.transitions",
    "finish": "picoflow.authoring.transitions",
    "go": "picoflow.authoring.transitions",
    "load_prompt": "picoflow.authoring.prompts",
    "prompt": "picoflow.authoring.prompts",
    "render": "picoflow.authoring.prompts",
    "retry_with_model": "picoflow.authoring.recovery",
    "stay": "picoflow.authoring.transitions",
    "tool": "picoflow.authoring.step_tools",
    "tools": "picoflow.authoring.step_tools",
}

__all__ = [
    "BaseMessage",
    "DecisionStep",
    "Flow",
    "FlowEngine",
    "LogicStep",
    "MCPServerSpec",
    "MCPTools",
    "ModelSelection",
    "RunResponse",
    "Step",
    "TerminateSessionStep",
    "ToolSpec",
    "Transition",
    "direct",
    "direct_to",
    "finish",
    "go",
    "load_prompt",
    "prompt",
    "render",
    "stay",
    "tool",
    "tools",
]


# Modules that moved into the layer packages (authoring, conversation, mcp, turn): their old dotted paths still
# import, as the very same module objects, with a DeprecationWarning naming the new home, until the next release.
_MOVED: dict[str, str] = {
    "picoflow.compaction": "picoflow.conversation.compaction",
    "picoflow.decision": "picoflow.authoring.decision",
    "picoflow.decision_questions": "picoflow.authoring.decision_questions",
    "picoflow.decision_step": "picoflow.authoring.decision_step",
    "picoflow.flow": "picoflow.authoring.flow",
    "picoflow.memory": "picoflow.conversation.memory",
    "picoflow.parallel": "picoflow.authoring.step_runs",
    "picoflow.prompts": "picoflow.authoring.prompts",
    "picoflow.recovery": "picoflow.authoring.recovery",
    "picoflow.recovery_hooks": "picoflow.authoring.recovery_hooks",
    "picoflow.registration": "picoflow.authoring.registration",
    "picoflow.run_context": "picoflow.authoring.run_context",
    "picoflow.state": "picoflow.conversation.state",
    "picoflow.step": "picoflow.authoring.step",
    "picoflow.step_registry": "picoflow.authoring.step_registry",
    "picoflow.step_tools": "picoflow.authoring.step_tools",
    "picoflow.transitions": "picoflow.authoring.transitions",
}


class _MovedModules:
    """A meta path finder that answers a moved module's old path with its new module."""

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        new = _MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


class _MovedLoader(importlib.abc.Loader):
    """Loads an old path as the module that now lives under its new one."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        warnings.warn(
            f"'{spec.name}' is deprecated and will be removed in the next release; use '{self.new}'.",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the old path's spec on the shared module: give the module its own back.
        module.__spec__ = self.spec


if not any(finder is _MovedModules for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules)


def __getattr__(name: str) -> Any:
    """Import a name's module on first use; ``__version__`` is the installed distribution's."""
    if name == "__version__":
        value = _version()
    elif name in __all__:
        value = getattr(importlib.import_module(_MODULES[name]), name)
    elif name in _MODULES:
        module = _MODULES[name]
        warnings.warn(
            f"'from picoflow import {name}' is deprecated and will be removed in the next release; "
            f"use 'from {module} import {name}'.",
            DeprecationWarning,
            stacklevel=2,
        )
        # Not cached, so that every deprecated use is reported where it happens.
        return getattr(importlib.import_module(module), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The public names are the authoring ones alone, whatever submodules and helpers the package holds.
    return sorted({*__all__, *(name for name in globals() if name.startswith("_"))})


def _version() -> str:
    # Read on first use, so that ``import picoflow`` does not import ``importlib.metadata``.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("picoflow-aws")
    except PackageNotFoundError:
        # A source tree that was never installed; tests/test_packaging.py keeps this in step with pyproject.toml.
        return "0.1.0"
