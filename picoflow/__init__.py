"""PicoFlow for Python: stateful multi-step LLM conversations as flows of steps.

The root offers the authoring names: flows, steps, tools, transitions, prompts, MCP declarations, the engine,
model selection and the run result. Everything else is imported from its own module: stores and the session
document from ``picoflow.stores``, errors from ``picoflow.errors``, messages from ``picoflow.messages``,
decision and parallel types from ``picoflow.decision`` and ``picoflow.parallel``.

Names load on first use, so ``import picoflow`` imports almost nothing (and never boto3).
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from picoflow.decision_step import DecisionStep
    from picoflow.engine import FlowEngine
    from picoflow.flow import Flow
    from picoflow.mcp import MCPServerSpec, MCPTools
    from picoflow.models.registry import ModelSelection
    from picoflow.prompts import load_prompt, prompt, render
    from picoflow.results import RunResponse
    from picoflow.step import LogicStep, Step, TerminateSessionStep
    from picoflow.step_tools import ToolSpec, tool, tools
    from picoflow.transitions import Transition, direct, direct_to, finish, go, stay

    __version__: str

# The module each name is imported from. Names outside ``__all__`` were exported here before they got a home of
# their own: they still resolve, with a DeprecationWarning naming that home, until the next release.
_MODULES: dict[str, str] = {
    "AiMessageEx": "picoflow.messages",
    # The type of the messages hooks such as ``Step.on_crossing`` receive and return: LangChain's own.
    "BaseMessage": "langchain_core.messages",
    "BranchResult": "picoflow.parallel",
    "CancellationSignal": "picoflow.parallel",
    "ChatDecisionProvider": "picoflow.decision",
    "Choice": "picoflow.decision",
    "ChoiceAnswer": "picoflow.decision",
    "DecisionContext": "picoflow.decision",
    "DecisionErrorContext": "picoflow.decision",
    "DecisionProvider": "picoflow.decision",
    "DecisionRequest": "picoflow.decision",
    "DecisionResult": "picoflow.decision",
    "DecisionStep": "picoflow.decision_step",
    "DecisionValidationError": "picoflow.errors",
    "DirectMessage": "picoflow.messages",
    "DynamoDBSessionStore": "picoflow.stores",
    "Flow": "picoflow.flow",
    "FlowEngine": "picoflow.engine",
    "HumanMessageEx": "picoflow.messages",
    "InvalidToolArguments": "picoflow.step_tools",
    "LlmAttemptErrorContext": "picoflow.recovery",
    "LlmBlockedContext": "picoflow.recovery",
    "LlmBlockedError": "picoflow.errors",
    "LlmCallPolicy": "picoflow.recovery",
    "LlmErrorContext": "picoflow.recovery",
    "LogicStep": "picoflow.step",
    "MCPServerSpec": "picoflow.mcp",
    "MCPTools": "picoflow.mcp",
    "MemorySessionStore": "picoflow.stores",
    "ModelSelection": "picoflow.models.registry",
    "Noul": "picoflow.decision",
    "NoulAnswer": "picoflow.decision",
    "ParallelBatchResult": "picoflow.parallel",
    "ParallelCancelledError": "picoflow.errors",
    "ParallelDuplicateKeyError": "picoflow.errors",
    "ParallelExecutionError": "picoflow.errors",
    "ParallelInvocation": "picoflow.parallel",
    "ParallelMutationError": "picoflow.errors",
    "ParallelStateConflictError": "picoflow.errors",
    "PicoFlowError": "picoflow.errors",
    "RetryWithModel": "picoflow.recovery",
    "RunResponse": "picoflow.results",
    "RunStepRequest": "picoflow.parallel",
    "SQLiteSessionStore": "picoflow.stores",
    "Score": "picoflow.decision",
    "ScoreAnswer": "picoflow.decision",
    "ScriptedDecisionProvider": "picoflow.decision",
    "SessionConflictError": "picoflow.errors",
    "SessionDoc": "picoflow.stores",
    "SessionFlowInvariantError": "picoflow.errors",
    "SessionFlowMismatchError": "picoflow.errors",
    "SessionLogger": "picoflow.logger",
    "SessionStore": "picoflow.stores",
    "SessionStoreError": "picoflow.errors",
    "SessionTooLargeError": "picoflow.errors",
    "StateChannel": "picoflow.parallel",
    "Step": "picoflow.step",
    "StepChannels": "picoflow.parallel",
    "TerminateSessionStep": "picoflow.step",
    "ToolMessageEx": "picoflow.messages",
    "ToolSpec": "picoflow.step_tools",
    "Transition": "picoflow.transitions",
    "direct": "picoflow.transitions",
    "direct_result": "picoflow.transitions",
    "direct_to": "picoflow.transitions",
    "finish": "picoflow.transitions",
    "go": "picoflow.transitions",
    "load_prompt": "picoflow.prompts",
    "prompt": "picoflow.prompts",
    "render": "picoflow.prompts",
    "retry_with_model": "picoflow.recovery",
    "stay": "picoflow.transitions",
    "tool": "picoflow.step_tools",
    "tools": "picoflow.step_tools",
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
