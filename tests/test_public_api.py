"""The root ``picoflow`` offers the authoring names only; the names it used to export keep resolving, with a warning
that names their own module, for one release."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import picoflow

ROOT = Path(__file__).resolve().parent.parent

# Every name the root exported before it was narrowed to the authoring names.
FORMERLY_EXPORTED = [
    "AiMessageEx", "BaseMessage", "BranchResult", "CancellationSignal", "ChatDecisionProvider", "Choice",
    "ChoiceAnswer", "DecisionContext", "DecisionErrorContext", "DecisionProvider", "DecisionRequest",
    "DecisionResult", "DecisionStep", "DecisionValidationError", "DirectMessage", "DynamoDBSessionStore", "Flow",
    "FlowEngine", "HumanMessageEx", "InvalidToolArguments", "LlmAttemptErrorContext", "LlmBlockedContext",
    "LlmBlockedError", "LlmCallPolicy", "LlmErrorContext", "LogicStep", "MemorySessionStore", "ModelSelection",
    "Noul", "NoulAnswer", "ParallelBatchResult", "ParallelCancelledError", "ParallelDuplicateKeyError",
    "ParallelExecutionError", "ParallelInvocation", "ParallelMutationError", "ParallelStateConflictError",
    "PicoFlowError", "RetryWithModel", "RunResponse", "RunStepRequest", "SQLiteSessionStore", "Score",
    "ScoreAnswer", "ScriptedDecisionProvider", "SessionConflictError", "SessionDoc", "SessionFlowInvariantError",
    "SessionFlowMismatchError", "SessionLogger", "SessionStore", "SessionStoreError", "SessionTooLargeError",
    "StateChannel", "Step", "StepChannels", "TerminateSessionStep", "ToolMessageEx", "ToolSpec", "Transition",
    "direct", "direct_result", "direct_to", "finish", "go", "load_prompt", "prompt", "render", "retry_with_model",
    "stay", "tool", "tools",
]

# A few moved names and the import that now names them.
NEW_HOMES = {
    "SessionConflictError": "picoflow.errors",
    "HumanMessageEx": "picoflow.messages",
    "SessionDoc": "picoflow.stores",
    "DynamoDBSessionStore": "picoflow.stores",
    "Choice": "picoflow.authoring.decision",
    "RunStepRequest": "picoflow.authoring.step_runs",
}


def test_the_root_offers_at_most_25_names_and_lists_only_those():
    assert len(picoflow.__all__) <= 25
    assert len(set(picoflow.__all__)) == len(picoflow.__all__)
    assert [name for name in dir(picoflow) if not name.startswith("_")] == sorted(picoflow.__all__)


@pytest.mark.parametrize("name", picoflow.__all__)
def test_every_root_name_imports_without_a_warning(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(f"from picoflow import {name}", {})


@pytest.mark.parametrize(("name", "module"), NEW_HOMES.items())
def test_a_moved_name_still_imports_from_the_root_with_a_warning_naming_its_home(name: str, module: str):
    with pytest.warns(DeprecationWarning) as caught:
        namespace: dict[str, object] = {}
        exec(f"from picoflow import {name}", namespace)
    assert f"from {module} import {name}" in str(caught[0].message)
    assert caught[0].filename == "<string>"  # reported at the import, not inside picoflow
    assert namespace[name] is getattr(importlib.import_module(module), name)
    assert name not in picoflow.__all__ and name not in dir(picoflow)


@pytest.mark.parametrize("name", FORMERLY_EXPORTED)
def test_every_formerly_exported_name_still_resolves(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        value = getattr(picoflow, name)
    assert value is not None
    # A moved name is the very object its new home exports.
    if name not in picoflow.__all__:
        with pytest.warns(DeprecationWarning, match=rf"from (\S+) import {name}'") as caught:
            getattr(picoflow, name)
        home = str(caught[0].message).split("'from ")[-1].split(" import")[0]
        assert getattr(importlib.import_module(home), name) is value


def test_the_stores_module_loads_a_store_only_when_it_is_used():
    check = (
        "import sys\nfrom picoflow.stores import MemorySessionStore, SQLiteSessionStore, SessionDoc, SessionStore\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'picoflow.session.dynamodb_store') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
