"""No log output of a conversation may carry what users typed, prompts, tool arguments or the OpenAI key.

Everything is captured at DEBUG: the Powertools logger's JSON lines, every Python logging record (message,
arguments and extra fields) and whatever reaches stdout/stderr (metrics included).
"""

import io
import json
import logging
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

import handlers.api as api
from picoflow import Flow, ModelSelection, Step, ToolSpec, stay, tool
from picoflow.aws import observability
from picoflow.aws import runtime as aws_runtime
from picoflow.aws.apigw import FakeLambdaContext, http_event

pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")

OPENAI_KEY = "sk-test-FAKEKEY-8c1d2e3f4a5b6c7d"
PROMPT = "PROMPT-MARKER-4b9e: you are the account desk"
TOOL_ARGUMENT = "TOOLARG-MARKER-77aa"
USER_MESSAGES = ["USERMSG-MARKER-one my card is 4111 1111 1111 1111", "USERMSG-MARKER-two", "USERMSG-MARKER-three"]
FIRST_KEY = "first-turn-key-6f1d2c1e9a8b4d3c7e5f"
SECRETS = [OPENAI_KEY, PROMPT, TOOL_ARGUMENT, *USER_MESSAGES, "4111 1111"]


class AccountArgs(BaseModel):
    account: str


class DeskStep(Step):
    def get_prompt(self) -> str:
        return PROMPT

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="lookup_account", description="Find an account.", schema=AccountArgs)]

    @tool
    async def lookup_account(self, args: dict) -> object:
        return stay("Found the account of someone.")


class DeskFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o")

    def define_steps(self) -> list[Step]:
        return [DeskStep(self)]


SCRIPT = [
    {"content": "", "tool_calls": [{"name": "lookup_account", "args": {"account": TOOL_ARGUMENT}, "id": "call-1"}]},
    {"content": "Account found."},
    {"content": "Noted."},
    {"content": "Anything else?"},
]


@pytest.fixture
def captured(moto_dynamodb, tmp_path, monkeypatch, caplog) -> Iterator[io.StringIO]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(script))
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("SESSION_STORE", "DYNAMODB")
    monkeypatch.setenv("SESSION_TABLE", moto_dynamodb.name)
    monkeypatch.setenv("PICOFLOW_FLOWS", __name__)
    for name in ("OPENAI_API_KEY_PARAMETER", "PICOFLOW_MAX_MESSAGE_CHARS", "DYNAMODB_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    stream = io.StringIO()
    monkeypatch.setattr(observability.logger.registered_handler, "stream", stream)
    level = observability.logger.log_level
    observability.logger.setLevel("DEBUG")
    caplog.set_level(logging.DEBUG)
    yield stream
    observability.logger.setLevel(level)
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)


def turn(message: str, session: str | None, key: str) -> dict:
    headers = {"Idempotency-Key": key, **({"CHAT_SESSION_ID": session} if session else {})}
    result = api.lambda_handler(
        http_event("POST", "/ai/run", body={"flowName": "DeskFlow", "message": message}, headers=headers),
        FakeLambdaContext(),
    )
    assert result["statusCode"] == 200, result["body"]
    return json.loads(result["body"])


def test_a_conversation_logs_none_of_its_content(captured, caplog, capsys):
    first = turn(USER_MESSAGES[0], None, FIRST_KEY)
    assert first["message"] == "Account found."
    session = first["session"]
    assert turn(USER_MESSAGES[1], session, "key-2")["message"] == "Noted."
    assert turn(USER_MESSAGES[1], session, "key-2")["message"] == "Noted."  # replayed
    assert turn(USER_MESSAGES[2], session, "key-3")["message"] == "Anything else?"
    refused = api.lambda_handler(
        http_event("POST", "/ai/run", body={"flowName": "DeskFlow", "message": {"text": USER_MESSAGES[2]}}),
        FakeLambdaContext(),
    )
    assert refused["statusCode"] == 400

    # The model saw the prompt and the tool result, so the markers were really in play.
    calls = aws_runtime.get_engine().providers.override.calls
    assert len(calls) == len(SCRIPT)
    assert PROMPT in str(calls[0]) and TOOL_ARGUMENT in str(calls[1])

    powertools = captured.getvalue()
    records = "\n".join(json.dumps(vars(record), default=str) for record in caplog.records)
    out, err = capsys.readouterr()
    assert "Turn finished" in powertools and "Idempotent replay" in powertools
    # The application's own log lines name the session by a digest only (the id lets its holder continue it).
    assert session not in powertools
    assert caplog.records, "Python logging was not captured"
    for name, text in {"powertools": powertools, "logging": records, "stdout": out, "stderr": err}.items():
        leaked = [secret for secret in (*SECRETS, FIRST_KEY) if secret in text]
        assert not leaked, f"{name} output carries {leaked}"
