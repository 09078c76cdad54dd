"""The documented local path after ``sam build``: the built function's folder answers every sample event.

``sam local invoke -e events/X.json`` mounts the folder ``sam build`` made (``make build-ApiFunction``) at
``/var/task`` and runs the template's handler there, in a fresh container, with the template's environment
overridden by ``events/env.json``. These tests do the same without Docker: the function is built into a
temporary folder, with wheels for this host's Python and machine instead of Lambda's (``LAMBDA_PYTHON`` and
``LAMBDA_PLATFORMS``; the requirements and files are the same), and each event runs in a fresh process whose
only packages are that folder's and the AWS SDK the Lambda runtime includes. The same for a project made by
``picoflow new``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml

from picoflow.local.scaffold import create_project
from tests.support.packaging import ROOT, copy_into, make_venv, run

TASK_ROOT = "/var/task"
HOST_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
HOST_PLATFORMS = f"manylinux2014_{platform.machine()} manylinux_2_28_{platform.machine()}"
# The Lambda Python runtime's own copy of the AWS SDK, which the build leaves out.
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer")
BUNDLED_FLOWS = [
    "BasicFlow", "HomeInsuranceQuoteFlow", "HotelFlow", "InvoiceFlow", "RefundFlow", "SupportFlow",
]

# What the function's process runs: the template's Handler, called with the event, its answer written to a file.
INVOKE = """
import importlib, json, sys
from picoflow.aws.apigw import FakeLambdaContext
module, _, name = sys.argv[1].rpartition(".")
handler = getattr(importlib.import_module(module), name)
with open(sys.argv[2]) as event:
    result = handler(json.load(event), FakeLambdaContext())
with open(sys.argv[3], "w") as answer:
    json.dump(result, answer)
"""


def build(project: Path, out: Path, *variables: str) -> Path:
    """``make build-ApiFunction`` of ``project`` into ``out`` for this host's Python and machine."""
    env = {**os.environ, "ARTIFACTS_DIR": str(out)}
    run(["make", "--no-print-directory", "build-ApiFunction", f"BUILD_PY={sys.executable}",
         f"LAMBDA_PYTHON={HOST_PYTHON}", f"LAMBDA_PLATFORMS={HOST_PLATFORMS}", *variables], cwd=project, env=env)
    return out


def lambda_runtime(base: Path) -> Path:
    """A folder holding the AWS SDK as the Lambda runtime provides it (this host's copy)."""
    base.mkdir(parents=True, exist_ok=True)
    for name in RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        (base / name).symlink_to(next(iter(spec.submodule_search_locations)))
    return base


def function_of(template_path: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The HTTP API's function (``ApiFunction``; the template may also hold the WebSocket API's)."""
    template = cfn_yaml.load(str(template_path))
    functions = {key: value for key, value in template["Resources"].items()
                 if value["Type"] == "AWS::Serverless::Function"}
    logical_id = "ApiFunction" if "ApiFunction" in functions else next(iter(functions))
    return logical_id, functions[logical_id]["Properties"], template.get("Parameters", {})


def resolved(value: Any, parameters: dict[str, Any]) -> str:
    """A template value as ``sam local`` passes it: a parameter's default, a resource's logical id."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        name = value["Ref"]
        return str(parameters[name].get("Default", "")) if name in parameters else name
    return "" if isinstance(value, dict) else str(value)


def function_environment(project: Path, folder: Path, runtime: Path) -> tuple[str, dict[str, str]]:
    """The template's handler and the environment ``sam local invoke`` gives it (``/var/task`` is ``folder``)."""
    logical_id, properties, parameters = function_of(project / "template.yaml")
    variables = {key: resolved(value, parameters)
                 for key, value in properties["Environment"]["Variables"].items()}
    variables.update(json.loads((project / "events" / "env.json").read_text())[logical_id])
    variables = {key: value.replace(TASK_ROOT, str(folder), 1) if value.startswith(f"{TASK_ROOT}/") else value
                 for key, value in variables.items()}
    timeout = resolved(properties.get("Timeout", 3), parameters)
    memory = resolved(properties.get("MemorySize", 128), parameters)
    lambda_variables = {
        "AWS_SAM_LOCAL": "true",
        "AWS_LAMBDA_FUNCTION_NAME": logical_id,
        "AWS_LAMBDA_FUNCTION_TIMEOUT": timeout,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory,
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "LAMBDA_TASK_ROOT": str(folder),
        "PATH": os.environ["PATH"],
        "HOME": str(folder.parent),
        "PYTHONPATH": f"{folder}:{runtime}",
    }
    return properties["Handler"], {**lambda_variables, **variables}


def invoke(python: Path, folder: Path, handler: str, env: dict[str, str], event: Path) -> dict[str, Any]:
    """``event`` through the built function in a fresh process, as one ``sam local invoke``."""
    answer = folder.parent / f"{event.stem}.answer.json"
    run([str(python), "-c", INVOKE, handler, str(event), str(answer)], cwd=folder, env=env, timeout=120)
    return json.loads(answer.read_text())


def header(result: dict[str, Any], name: str) -> str | None:
    return {key.lower(): value for key, value in result.get("headers", {}).items()}.get(name)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python without any installed package: the function sees only its folder and the runtime's SDK."""
    return make_venv(tmp_path_factory.mktemp("bare") / "venv")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lambda_runtime(tmp_path_factory.mktemp("runtime") / "packages")


@pytest.fixture(scope="module")
def repository_function(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("repository")
    checkout = copy_into(base / "checkout", ["Makefile", "requirements.txt", "pyproject.toml", "README.md", "LICENSE",
                                             "template.yaml", "picoflow", "handlers", "flows", "events"])
    return checkout, build(checkout, base / "function")


SAMPLE_EVENTS = sorted(p.name for p in (ROOT / "events").glob("*.json") if p.name not in ("env.json", "script.json"))


@pytest.mark.parametrize("name", SAMPLE_EVENTS)
def test_each_sample_event_answers_from_the_built_function(name, repository_function, bare_python, runtime):
    checkout, folder = repository_function
    handler, env = function_environment(checkout, folder, runtime)
    assert env["PICOFLOW_SCRIPT"].startswith(f"{folder}/"), "the script must be named by its path in the function"
    event_path = ROOT / "events" / name
    result = invoke(bare_python, folder, handler, env, event_path)
    body = json.loads(result["body"]) if result.get("body") else None
    script = json.loads((ROOT / "events" / "script.json").read_text())
    event = json.loads(event_path.read_text())
    if name == "health.json":
        assert result["statusCode"] == 200, body
    elif name == "list-flows.json":
        assert (result["statusCode"], sorted(body)) == (200, BUNDLED_FLOWS)
    elif name.startswith("run-"):
        # Each invocation is a fresh container: a follow-up's session id names no session there, so a new one starts.
        assert (result["statusCode"], body["success"], body["message"]) == (200, True, script[0]["content"]), body
        session = header(result, "chat_session_id")
        assert session and session == body["session"]
        assert session != event["headers"].get("chat_session_id")
    elif name == "end-session.json":
        assert (result["statusCode"], body["success"]) == (404, False), body
    else:
        pytest.fail(f"events/{name} has no documented answer here")


@pytest.fixture(scope="module")
def project_function(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("project")
    project = create_project("travel-desk", base)
    # Where `picoflow new` puts the library's wheel, which the build finds there.
    (project / "wheels").mkdir()
    shutil.copy2(wheel, project / "wheels" / wheel.name)
    return project, build(project, base / "function")


def test_a_new_projects_sample_event_answers_from_its_built_function(project_function, bare_python, runtime):
    project, folder = project_function
    handler, env = function_environment(project, folder, runtime)
    assert env["PICOFLOW_SCRIPT"].startswith(f"{folder}/")
    script = json.loads((project / "events" / "script.json").read_text())
    events = sorted((project / "events").glob("*.json"))
    samples = [path for path in events if path.name not in ("env.json", "script.json")]
    assert samples
    for event in samples:
        result = invoke(bare_python, folder, handler, env, event)
        body = json.loads(result["body"])
        assert (result["statusCode"], body["success"]) == (200, True), body
        assert body["message"] == script[0]["content"]
