"""The function's log lines, as CloudWatch receives them: one JSON object per line, library lines included.

Each scenario runs in a fresh interpreter, since the service name and the tracer are settled at import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TURNS = """
import sys
import handlers.api as api
from picoflow.aws.apigw import FakeLambdaContext, http_event

key = sys.argv[1]
for request_id, flow in (("gw-first", "EchoFlow"), ("gw-retry", "EchoFlow"), ("gw-unknown", "NoSuchFlow")):
    headers = {"Idempotency-Key": key} if flow == "EchoFlow" else {}
    event = http_event("POST", "/ai/run", body={"flowName": flow, "message": "hi"}, headers=headers,
                       request_id=request_id)
    api.lambda_handler(event, FakeLambdaContext())
"""


def run_python(code: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "reply"}]))
    environ = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "SESSION_STORE": "MEMORY",
        "PICOFLOW_FLOWS": "tests.support.echo_flows",
        "PICOFLOW_SCRIPT": str(script),
        "POWERTOOLS_METRICS_DISABLED": "true",
        **env,
    }
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env=environ)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_library_lines_are_json_with_the_correlation_id_under_any_service_name(tmp_path):
    result = run_python(TURNS, tmp_path, str(uuid.uuid4()), POWERTOOLS_SERVICE_NAME="my-api")
    lines = [json.loads(line) for line in result.stdout.splitlines() + result.stderr.splitlines()]
    assert lines and all(line["service"] == "my-api" for line in lines)
    by_message = {line["message"]: line for line in lines if "_aws" not in line}  # not the metrics documents
    # Lines of the library's own logger, written while the engine ran the turn.
    assert by_message["Idempotent replay"]["correlation_id"] == "gw-retry"
    assert by_message["Turn failed"]["correlation_id"] == "gw-unknown"
    assert by_message["Turn failed"]["function_request_id"]


def test_the_handler_imports_no_tracing_sdk_outside_lambda(tmp_path):
    probe = "import sys, handlers.api\nprint('aws_xray_sdk' in sys.modules)"
    assert run_python(probe, tmp_path).stdout.split() == ["False"]
    in_lambda = run_python(probe, tmp_path, AWS_LAMBDA_FUNCTION_NAME="picoflow-api", AWS_REGION="us-east-1")
    assert in_lambda.stdout.split()[-1] == "True"
    disabled = {"AWS_LAMBDA_FUNCTION_NAME": "picoflow-api", "POWERTOOLS_TRACE_DISABLED": "true"}
    assert run_python(probe, tmp_path, **disabled).stdout.split() == ["False"]
