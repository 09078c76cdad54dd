"""PicoFlow for Python: stateful multi-step LLM conversations as flows of steps.

Public names load on first use, so ``import picoflow`` imports almost nothing (and never boto3).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from picoflow.decision import (
        ChatDecisionProvider,
        Choice,
        ChoiceAnswer,
        DecisionContext,
        DecisionErrorContext,
        DecisionProvider,
        DecisionRequest,
        DecisionResult,
        Noul,
        NoulAnswer,
        Score,
        ScoreAnswer,
        ScriptedDecisionProvider,
    )
    from picoflow.decision_step import DecisionStep
    from picoflow.engine import FlowEngine
    from picoflow.errors import (
        DecisionValidationError,
        LlmBlockedError,
        ParallelCancelledError,
        ParallelDuplicateKeyError,
        ParallelExecutionError,
        ParallelMutationError,
        ParallelStateConflictError,
        PicoFlowError,
        SessionConflictError,
        SessionFlowInvariantError,
        SessionFlowMismatchError,
        SessionStoreError,
        SessionTooLargeError,
    )
    from picoflow.flow import Flow
    from picoflow.logger import SessionLogger
    from picoflow.messages import AiMessageEx, DirectMessage, HumanMessageEx, ToolMessageEx
    from picoflow.models.registry import ModelSelection
    from picoflow.parallel import (
        BranchResult,
        CancellationSignal,
        ParallelBatchResult,
        ParallelInvocation,
        RunStepRequest,
        StateChannel,
        StepChannels,
    )
    from picoflow.prompts import load_prompt, prompt, render
    from picoflow.recovery import (
        LlmAttemptErrorContext,
        LlmBlockedContext,
        LlmErrorContext,
        RetryWithModel,
        retry_with_model,
    )
    from picoflow.results import RunResponse
    from picoflow.session.document import SessionDoc
    from picoflow.session.dynamodb_store import DynamoDBSessionStore
    from picoflow.session.memory_store import MemorySessionStore
    from picoflow.session.sqlite_store import SQLiteSessionStore
    from picoflow.session.store import SessionStore
    from picoflow.step import (
        LlmCallPolicy,
        LogicStep,
        Step,
        TerminateSessionStep,
        Transition,
        direct,
        direct_result,
        direct_to,
        finish,
        go,
        stay,
    )
    from picoflow.tools import InvalidToolArguments, ToolSpec, tool, tools

    __version__: str

# Where each public name lives.
_EXPORTS: dict[str, str] = {
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
    "DynamoDBSessionStore": "picoflow.session.dynamodb_store",
    "Flow": "picoflow.flow",
    "FlowEngine": "picoflow.engine",
    "HumanMessageEx": "picoflow.messages",
    "InvalidToolArguments": "picoflow.tools",
    "LlmAttemptErrorContext": "picoflow.recovery",
    "LlmBlockedContext": "picoflow.recovery",
    "LlmBlockedError": "picoflow.errors",
    "LlmCallPolicy": "picoflow.step",
    "LlmErrorContext": "picoflow.recovery",
    "LogicStep": "picoflow.step",
    "MemorySessionStore": "picoflow.session.memory_store",
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
    "SQLiteSessionStore": "picoflow.session.sqlite_store",
    "Score": "picoflow.decision",
    "ScoreAnswer": "picoflow.decision",
    "ScriptedDecisionProvider": "picoflow.decision",
    "SessionConflictError": "picoflow.errors",
    "SessionDoc": "picoflow.session.document",
    "SessionFlowInvariantError": "picoflow.errors",
    "SessionFlowMismatchError": "picoflow.errors",
    "SessionLogger": "picoflow.logger",
    "SessionStore": "picoflow.session.store",
    "SessionStoreError": "picoflow.errors",
    "SessionTooLargeError": "picoflow.errors",
    "StateChannel": "picoflow.parallel",
    "Step": "picoflow.step",
    "StepChannels": "picoflow.parallel",
    "TerminateSessionStep": "picoflow.step",
    "ToolMessageEx": "picoflow.messages",
    "ToolSpec": "picoflow.tools",
    "Transition": "picoflow.step",
    "direct": "picoflow.step",
    "direct_result": "picoflow.step",
    "direct_to": "picoflow.step",
    "finish": "picoflow.step",
    "go": "picoflow.step",
    "load_prompt": "picoflow.prompts",
    "prompt": "picoflow.prompts",
    "render": "picoflow.prompts",
    "retry_with_model": "picoflow.recovery",
    "stay": "picoflow.step",
    "tool": "picoflow.tools",
    "tools": "picoflow.tools",
}

__all__ = [
    "AiMessageEx",
    "BaseMessage",
    "BranchResult",
    "CancellationSignal",
    "ChatDecisionProvider",
    "Choice",
    "ChoiceAnswer",
    "DecisionContext",
    "DecisionErrorContext",
    "DecisionProvider",
    "DecisionRequest",
    "DecisionResult",
    "DecisionStep",
    "DecisionValidationError",
    "DirectMessage",
    "DynamoDBSessionStore",
    "Flow",
    "FlowEngine",
    "HumanMessageEx",
    "InvalidToolArguments",
    "LlmAttemptErrorContext",
    "LlmBlockedContext",
    "LlmBlockedError",
    "LlmCallPolicy",
    "LlmErrorContext",
    "LogicStep",
    "MemorySessionStore",
    "ModelSelection",
    "Noul",
    "NoulAnswer",
    "ParallelBatchResult",
    "ParallelCancelledError",
    "ParallelDuplicateKeyError",
    "ParallelExecutionError",
    "ParallelInvocation",
    "ParallelMutationError",
    "ParallelStateConflictError",
    "PicoFlowError",
    "RetryWithModel",
    "RunResponse",
    "RunStepRequest",
    "SQLiteSessionStore",
    "Score",
    "ScoreAnswer",
    "ScriptedDecisionProvider",
    "SessionConflictError",
    "SessionDoc",
    "SessionFlowInvariantError",
    "SessionFlowMismatchError",
    "SessionLogger",
    "SessionStore",
    "SessionStoreError",
    "SessionTooLargeError",
    "StateChannel",
    "Step",
    "StepChannels",
    "TerminateSessionStep",
    "ToolMessageEx",
    "ToolSpec",
    "Transition",
    "direct",
    "direct_result",
    "direct_to",
    "finish",
    "go",
    "load_prompt",
    "prompt",
    "render",
    "retry_with_model",
    "stay",
    "tool",
    "tools",
]


class _Package(types.ModuleType):
    """This package: importing the submodule ``picoflow.tools`` must not replace the public ``tools`` decorator."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use; ``__version__`` is the installed distribution's."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


def _version() -> str:
    # Read on first use, so that ``import picoflow`` does not import ``importlib.metadata``.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("picoflow-aws")
    except PackageNotFoundError:
        # A source tree that was never installed; tests/test_packaging.py keeps this in step with pyproject.toml.
        return "0.1.0"
