"""PicoFlow for Python: stateful multi-step LLM conversations as flows of steps."""

from typing import TYPE_CHECKING

from picoflow.decision import (
    ChatDecisionProvider,
    Choice,
    ChoiceAnswer,
    DecisionContext,
    DecisionErrorContext,
    DecisionProvider,
    DecisionRequest,
    DecisionResult,
    DecisionStep,
    DecisionValidationError,
    Noul,
    NoulAnswer,
    Score,
    ScoreAnswer,
    ScriptedDecisionProvider,
)
from picoflow.engine import FlowEngine, RunResponse
from picoflow.errors import (
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
from picoflow.models.selection import ModelSelection
from picoflow.parallel import (
    BranchResult,
    CancellationSignal,
    ParallelBatchResult,
    ParallelCancelledError,
    ParallelDuplicateKeyError,
    ParallelExecutionError,
    ParallelInvocation,
    ParallelMutationError,
    ParallelStateConflictError,
    RunStepRequest,
    StateChannel,
    StepChannels,
    direct_result,
)
from picoflow.prompts import load_prompt, prompt, render
from picoflow.recovery import (
    LlmAttemptErrorContext,
    LlmBlockedContext,
    LlmBlockedError,
    LlmCallPolicy,
    LlmErrorContext,
    RetryWithModel,
    retry_with_model,
)
from picoflow.session.document import SessionDoc
from picoflow.session.dynamodb_store import DynamoDBSessionStore
from picoflow.session.memory_store import MemorySessionStore
from picoflow.session.sqlite_store import SQLiteSessionStore
from picoflow.session.store import SessionStore
from picoflow.step import LogicStep, Step, TerminateSessionStep
from picoflow.tools import ToolSpec, tool, tools
from picoflow.transitions import Transition, direct, direct_to, finish, go, stay

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        """``picoflow.__version__``: the installed distribution's (picoflow-aws), else the source tree's.

        Read on first use, so that ``import picoflow`` does not import ``importlib.metadata``.
        """
        if name != "__version__":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("picoflow-aws")
        except PackageNotFoundError:
            value = "0.1.0"
        globals()["__version__"] = value
        return value


__all__ = [
    "AiMessageEx",
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
