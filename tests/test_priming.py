"""Priming at init or around a SnapStart snapshot (picoflow.aws.priming), on moto-backed DynamoDB."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import snapshot_restore_py

import handlers.api as api
from picoflow import Flow, ModelSelection, Step
from picoflow.aws import observability, priming
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event
from tests.support import echo_flows

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = [{"content": f"reply {n}", "usage": {"input_tokens": 10, "output_tokens": 2}} for n in range(1, 5)]


@pytest.fixture
def container(moto_dynamodb, tmp_path, monkeypatch) -> Iterator[Any]:
    """The handler's environment on a moto table, no runtime built yet, and empty SnapStart hook registries."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", echo_flows.__name__)
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    for name in ("OPENAI_API_KEY", "OPENAI_API_KEY_PARAMETER", "DYNAMODB_ENDPOINT_URL", priming.PRIME_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    monkeypatch.setattr(snapshot_restore_py, "_before_snapshot_registry", [])
    monkeypatch.setattr(snapshot_restore_py, "_after_restore_registry", [])
    yield moto_dynamodb
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def run_hooks(registry: list[tuple[Any, tuple, dict]]) -> None:
    """Call registered hooks as the Lambda runtime does."""
    for func, args, kwargs in registry:
        func(*args, **kwargs)


def turn(session: str | None = None) -> dict[str, Any]:
    headers = {"CHAT_SESSION_ID": session} if session else None
    event = http_event("POST", "/ai/run", body={"flowName": "EchoFlow", "message": "hi"}, headers=headers)
    result = api.lambda_handler(event, FakeLambdaContext())
    assert result["statusCode"] == 200, result
    return json.loads(result["body"])


def items(table) -> list[dict[str, Any]]:
    return table.client.scan(TableName=table.name, ConsistentRead=True)["Items"]


def test_outside_lambda_nothing_is_primed(container):
    assert priming.install({}) == "off"
    assert aws_runtime._runtime is None
    assert snapshot_restore_py.get_before_snapshot() == []


def test_prime_can_be_turned_off_inside_lambda(container):
    env = {priming.INIT_TYPE_VARIABLE: "on-demand", priming.PRIME_VARIABLE: "false"}
    assert priming.install(env) == "off"
    assert aws_runtime._runtime is None


def test_on_demand_init_primes_at_once_without_touching_the_table(container):
    assert priming.install({priming.INIT_TYPE_VARIABLE: "on-demand"}) == "init"
    runtime = aws_runtime._runtime
    assert runtime is not None
    assert snapshot_restore_py.get_before_snapshot() == snapshot_restore_py.get_after_restore() == []
    # The priming turns ran on a scratch store and model: the table, the script and the metrics are untouched.
    assert items(container) == []
    assert runtime.engine.providers.override.remaining == len(SCRIPT)
    assert runtime.engine.get_flow_names() == ["EchoFlow", "JsonFlow"]
    assert not observability.metrics.metric_set
    body = turn()
    assert body["message"] == "reply 1"
    assert len(items(container)) == 1


def test_snapstart_primes_before_the_snapshot_and_renews_clients_after_restore(container):
    assert priming.install({priming.INIT_TYPE_VARIABLE: priming.SNAP_START}) == "snapshot"
    assert [f for f, _, _ in snapshot_restore_py.get_before_snapshot()] == [priming.prime]
    assert [f for f, _, _ in snapshot_restore_py.get_after_restore()] == [priming.refresh]
    assert aws_runtime._runtime is None  # nothing is built until the runtime calls the hook

    run_hooks(snapshot_restore_py.get_before_snapshot())
    snapshot_engine = aws_runtime.get_engine()
    snapshot_client = snapshot_engine.session_store.client
    random.seed(7)
    seeded = random.getstate()

    run_hooks(snapshot_restore_py.get_after_restore())
    restored = aws_runtime.get_engine()
    assert restored is not snapshot_engine
    assert restored.session_store.client is not snapshot_client
    assert restored.session_store.client._endpoint is not snapshot_client._endpoint  # its own connection pool
    assert random.getstate() != seeded
    # The restored engine serves turns on the table, a new session and a continued one.
    first = turn()
    second = turn(first["session"])
    assert (first["message"], second["message"]) == ("reply 1", "reply 2")
    assert [int(item["revision"]["N"]) for item in items(container)] == [2]


def test_snapstart_without_the_hook_library_primes_at_init(container, monkeypatch):
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)
    assert priming.install({priming.INIT_TYPE_VARIABLE: priming.SNAP_START}) == "init"
    assert aws_runtime._runtime is not None


def test_priming_builds_each_flows_chat_models_once(container, monkeypatch):
    monkeypatch.setenv("PICOFLOW_FLOWS", SummaryFlow.__module__)
    built: list[ModelSelection] = []
    runtime = aws_runtime.get_runtime()
    provider = runtime.engine.providers.override
    original = provider.chat_model

    def counting(selection: ModelSelection) -> Any:
        built.append(selection)
        return original(selection)

    monkeypatch.setattr(provider, "chat_model", counting)
    priming.prime()
    assert sorted(s.name for s in built) == ["gpt-4o", "gpt-4o-mini"]
    before = list(built)
    priming.prime_clients(runtime)
    assert built == before  # cached by the registry: the first turn reuses what priming built


class SummaryStep(Step):
    def get_prompt(self) -> str:
        return "Answer."


class SummaryFlow(Flow):
    """A step on the flow's model, and a summary model of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.get_memory().set_summary_model(ModelSelection(provider="openai", name="gpt-4o-mini"))

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [SummaryStep(self)]


class ConfiguredFlow(Flow):
    """A flow whose steps need a request's config."""

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name=self.get_context("config.model"))


def test_model_selections_are_distinct_and_skip_flows_that_need_a_request():
    assert [s.name for s in priming.model_selections(SummaryFlow)] == ["gpt-4o", "gpt-4o-mini"]
    assert priming.model_selections(ConfiguredFlow) == []


def test_the_handler_module_installs_the_hooks_inside_a_snapstart_init(tmp_path):
    probe = (
        "import handlers.api, snapshot_restore_py as s\n"
        "print([f.__name__ for f, _, _ in s.get_before_snapshot()], [f.__name__ for f, _, _ in s.get_after_restore()])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), priming.INIT_TYPE_VARIABLE: priming.SNAP_START,
           "POWERTOOLS_METRICS_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == "['prime'] ['refresh']"


def test_priming_an_openai_flow_stays_offline(container, monkeypatch):
    # No script: EchoFlow's gpt-4o is a real ChatOpenAI, whose request path priming runs on loopback only.
    monkeypatch.delenv("PICOFLOW_SCRIPT")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://openai.invalid/v1")
    warnings: list[str] = []
    monkeypatch.setattr(observability.logger, "warning", lambda message, *a, **k: warnings.append(message))
    priming.prime()
    assert warnings == []
    model = aws_runtime.get_engine().providers.chat_model(ModelSelection(provider="openai", name="gpt-4o"))
    assert type(model).__name__ == "ChatOpenAI"
    assert model.openai_api_base == "http://openai.invalid/v1"
