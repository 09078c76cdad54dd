"""The files a new user's SAM loop reads: sample events, the local environment, samconfig defaults."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

import handlers.api as api
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


def test_every_variable_of_the_local_environment_is_declared_by_the_function():
    # sam local only overrides variables the template declares; any other key would be ignored silently.
    env = json.loads((EVENTS / "env.json").read_text())
    template = cfn_yaml.load(str(ROOT / "template.yaml"))
    function = "ApiFunction"
    declared = template["Resources"][function]["Properties"]["Environment"]["Variables"]
    assert set(env) == {function}
    assert set(env[function]) <= set(declared)


def test_the_local_script_holds_valid_replies():
    from picoflow.models.scripted import ScriptedProvider

    assert ScriptedProvider.from_file(EVENTS / "script.json").remaining >= 1


def test_samconfig_defaults_point_at_the_stack_and_the_local_environment():
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]
    assert config["global"]["parameters"]["stack_name"] == "picoflow"
    assert config["deploy"]["parameters"]["capabilities"] == "CAPABILITY_IAM"
    assert config["local_invoke"]["parameters"]["env_vars"] == "events/env.json"
    assert (ROOT / config["local_start_api"]["parameters"]["env_vars"]).is_file()


SAMPLE_EVENTS = sorted(p.name for p in EVENTS.glob("*.json") if p.name not in ("env.json", "script.json"))


@pytest.mark.parametrize("name", SAMPLE_EVENTS)
def test_each_sample_event_runs_through_the_handler(name, monkeypatch):
    env = json.loads((EVENTS / "env.json").read_text())["ApiFunction"]
    for key, value in env.items():
        # The function's code is at /var/task, where `make build-ApiFunction` put events/script.json.
        monkeypatch.setenv(key, value.replace("/var/task", str(ROOT), 1) if key == "PICOFLOW_SCRIPT" else value)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    event = json.loads((EVENTS / name).read_text())
    result = api.lambda_handler(event, FakeLambdaContext())
    # The end event names a session no fresh container holds: the documented 404.
    expected = 404 if name == "end-session.json" else 200
    assert result["statusCode"] == expected, result["body"]
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)
