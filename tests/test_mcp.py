"""Tools from MCP servers, against real servers in separate processes over streamable HTTP and stdio.

Each test runs McpFlow (``tests/support/mcp_flow.py``) on a scripted model; its server is the test server
(``tests/support/mcp_test_server.py``), started by the test as its own process.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from picoflow import FlowEngine
from picoflow.authoring.step_registry import collect_steps
from picoflow.errors import PUBLIC_MESSAGES, RETRY_AFTER_SECONDS
from picoflow.mcp import (
    UNAVAILABLE_TOOL_FEEDBACK,
    MCPServerSpec,
    MCPTools,
    MCPUnavailableError,
    offered_tools,
)
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.dynamodb_local import REGION
from tests.support.mcp_flow import McpFlow, server_spec
from tests.support.mcp_servers import HttpServer, OpenedSessions, free_port
from tests.support.mcp_test_server import SECRET

TRANSPORTS = ["http", "stdio"]
SESSIONS = OpenedSessions()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer("tests.support.mcp_test_server", tmp_path_factory.mktemp("mcp") / "server.log").start()
    yield server
    server.stop()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, http_server: HttpServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """McpFlow's server over each transport: the module's HTTP server, or a stdio server the flow starts."""
    monkeypatch.delenv("MCP_TEST_COMMAND", raising=False)
    if request.param == "http":
        monkeypatch.setenv("MCP_TEST_URL", http_server.url)
    else:
        monkeypatch.delenv("MCP_TEST_URL", raising=False)
    return request.param


@pytest.fixture(autouse=True)
async def sessions_closed() -> Any:
    yield
    await SESSIONS.close()


def call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "args": args, "id": call_id}]}


def engine(script: list[dict[str, Any]]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(script)
    engine_ = FlowEngine(flows=[McpFlow], session_store=MemorySessionStore(), providers=[provider])
    return SESSIONS.kept(engine_), provider


async def stored(engine_: FlowEngine, session: str) -> dict[str, Any]:
    return (await engine_.session_store.load(session)).to_json_dict()


# -- offering and calling ----------------------------------------------------------------------------------


async def test_a_step_offers_its_allowlist_with_the_servers_schemas(transport: str) -> None:
    flow = McpFlow()
    collect_steps(flow)
    step = flow.get_step("OfferStep")
    offered = (await offered_tools(SESSIONS.direct, flow, step.use_mcp_tools())).tools
    assert sorted(offered) == ["add", "big", "fail", "slow"]
    described = offered["add"].as_model_tool()["function"]
    assert described["description"] == "Add two integers."
    assert described["parameters"]["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert described["parameters"]["required"] == ["a", "b"]

    run, provider = engine([call("add", {"a": 2, "b": 3}), {"content": "the sum is 5"}])
    response = await run.run("McpFlow", "add 2 and 3", config={"start": "OfferStep"})
    assert response.success, response
    assert response.message == "the sum is 5"
    assert sorted(provider.tools[0]) == ["add", "big", "fail", "slow"], "only the allowlist reaches the model"
    result = provider.calls[1][-1]
    assert result.type == "tool" and json.loads(result.content)["total"] == 5


async def test_a_tool_outside_the_allowlist_is_never_called(transport: str) -> None:
    run, provider = engine([call("hidden", {}), {"content": "ok"}])
    response = await run.run("McpFlow", "call the hidden tool", config={"start": "OfferStep"})
    assert response.success
    assert "hallucinates" in provider.calls[1][-1].content
    counts = (await run.mcp.call_tool(server_spec(), "calls")).structured["counts"]
    assert "hidden" not in counts


async def test_arguments_that_do_not_fit_the_servers_schema_go_back_to_the_model(transport: str) -> None:
    run, provider = engine([call("add", {"a": "two", "b": 3}), {"content": "sorry"}])
    response = await run.run("McpFlow", "add", config={"start": "OfferStep"})
    assert response.success
    feedback = provider.calls[1][-1].content
    assert feedback.startswith("Invalid arguments for tool 'add': a:") and "Call the tool again" in feedback


async def test_a_handler_calls_a_tool_as_a_backend_and_gets_the_validated_result(transport: str) -> None:
    run, _ = engine([call("sum_numbers", {"a": 20, "b": 22})])
    response = await run.run("McpFlow", "add")
    assert response.success and response.message.startswith("backend total 42 from ")
    assert (await stored(run, response.session))["flow"]["steps"][0]["state"]["total"] == 42


async def test_a_stdio_server_starts_when_sys_stderr_is_not_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # A test's output capture or a logging shim replaces sys.stderr; the server process still gets a real one.
    monkeypatch.delenv("MCP_TEST_URL", raising=False)
    monkeypatch.delenv("MCP_TEST_COMMAND", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    run, _ = engine([call("sum_numbers", {"a": 20, "b": 22})])
    response = await run.run("McpFlow", "add")
    assert response.success and response.message.startswith("backend total 42 from ")


async def test_a_step_handler_receives_the_servers_result(transport: str) -> None:
    run, provider = engine([call("add", {"a": 1, "b": 2})])
    response = await run.run("McpFlow", "add", config={"start": "HandledStep"})
    assert response.success and response.message == "handled total 3"

    run, provider = engine([call("fail", {"reason": "x"}), {"content": "it failed"}])
    response = await run.run("McpFlow", "fail", config={"start": "HandledStep"})
    assert response.success and response.message == "it failed"
    assert provider.calls[1][-1].content == "handled failure"


async def test_a_result_larger_than_the_cap_is_cut_with_a_marker(transport: str) -> None:
    run, provider = engine([call("big", {"chars": 5000}), {"content": "long"}])
    response = await run.run("McpFlow", "big", config={"start": "OfferStep"})
    assert response.success
    content = provider.calls[1][-1].content
    assert content == "x" * 200 + "\n[result cut: 200 of 5000 characters shown]"
    assert "x" * 201 not in json.dumps(await stored(run, response.session))


# -- failures ------------------------------------------------------------------------------------------------


def assert_unavailable(response: Any, before: dict[str, Any], after: dict[str, Any], caplog: Any) -> None:
    assert not response.success
    assert (response.status_code, response.error_code) == (503, "MCP_UNAVAILABLE")
    assert response.retry_after == RETRY_AFTER_SECONDS["MCP_UNAVAILABLE"]
    assert response.message == PUBLIC_MESSAGES["MCP_UNAVAILABLE"]
    assert after == before, "a transient failure leaves the session unchanged"
    body = json.dumps(response.envelope())
    for text in ("SECRET", "internal.example", "127.0.0.1", "mcp_test_server"):
        assert text not in body
    assert "SECRET" not in json.dumps(response.model_dump()), "not even the logged detail quotes the server"
    for record in caplog.records:
        assert "SECRET" not in record.getMessage() and "internal.example" not in record.getMessage()


async def opened(run: FlowEngine) -> tuple[str, dict[str, Any]]:
    first = await run.run("McpFlow", "hello")
    assert first.success, first
    return first.session, await stored(run, first.session)


@pytest.mark.parametrize("tool_name", ["broken", "sluggish"])
async def test_a_failing_or_slow_server_fails_the_turn_as_retryable_and_keeps_the_session(
    transport: str, tool_name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MCP_TEST_TIMEOUT", "1.5")
    run, _ = engine([{"content": "hi"}, call(tool_name, {"a": 5, "b": 0})])
    session, before = await opened(run)
    response = await run.run("McpFlow", "go", session)
    assert_unavailable(response, before, await stored(run, session), caplog)


@pytest.mark.parametrize("where", TRANSPORTS)
async def test_a_server_that_is_down_fails_the_turn_as_retryable(
    where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if where == "http":
        monkeypatch.setenv("MCP_TEST_URL", f"http://127.0.0.1:{free_port()}/mcp")
    else:
        monkeypatch.delenv("MCP_TEST_URL", raising=False)
        monkeypatch.setenv("MCP_TEST_COMMAND", f"{sys.executable} -c 'raise SystemExit(3)'")
    run, _ = engine([{"content": "hi"}, call("sum_numbers", {"a": 1, "b": 1})])
    session, before = await opened(run)
    response = await run.run("McpFlow", "go", session)
    assert_unavailable(response, before, await stored(run, session), caplog)


async def test_a_handler_catches_the_failure_and_stays(transport: str) -> None:
    run, provider = engine([call("guarded", {"a": 1, "b": 1}), {"content": "please retry later"}])
    response = await run.run("McpFlow", "go")
    assert response.success and response.message == "please retry later"
    assert provider.calls[1][-1].content == "the service is unavailable, ask the user to retry"


async def test_a_failing_offered_tool_answers_the_model_with_a_fixed_sentence(transport: str) -> None:
    run, provider = engine([call("fail", {"reason": "x"}), {"content": "unavailable"}])
    response = await run.run("McpFlow", "fail", config={"start": "OfferStep"})
    assert response.success
    assert provider.calls[1][-1].content == UNAVAILABLE_TOOL_FEEDBACK
    assert SECRET not in json.dumps(await stored(run, response.session))


# -- sessions ------------------------------------------------------------------------------------------------


def pid_of(message: str) -> int:
    return int(message.rsplit(" ", 1)[1])


async def test_a_server_restarted_between_turns_is_reconnected_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    for where in TRANSPORTS:
        caplog.clear()
        server = None
        if where == "http":
            server = HttpServer("tests.support.mcp_test_server", tmp_path / "restart.log").start()
            monkeypatch.setenv("MCP_TEST_URL", server.url)
        else:
            monkeypatch.delenv("MCP_TEST_URL", raising=False)
        try:
            script = [call("sum_numbers", {"a": 1, "b": 1}, f"c{n}") for n in range(3)]
            run, _ = engine(script)
            first = await run.run("McpFlow", "one")
            assert first.success, first
            pid = pid_of(first.message)
            opened_before = [r for r in caplog.records if r.getMessage() == "MCP session opened"]
            assert len(opened_before) == 1
            second = await run.run("McpFlow", "two", first.session)
            assert pid_of(second.message) == pid, "a warm session is reused across turns"
            if server is not None:
                server.stop()
                server.start()
            else:
                os.kill(pid, signal.SIGKILL)
            third = await run.run("McpFlow", "three", first.session)
            assert third.success, third
            assert pid_of(third.message) != pid
            opened_after = [r for r in caplog.records if r.getMessage() == "MCP session opened"]
            stale = [r for r in caplog.records if r.getMessage() == "MCP session went stale; reconnecting once"]
            if where == "stdio":
                assert len(stale) == 1 and len(opened_after) == 2
            else:
                # Streamable HTTP keeps no connection state the restart could break, or reconnects once.
                assert len(stale) <= 1 and len(opened_after) <= 2
        finally:
            await run.close()
            if server is not None:
                server.stop()


def test_declarations_refuse_an_ambiguous_transport_and_an_empty_offer() -> None:
    with pytest.raises(ValueError, match="exactly one of url"):
        MCPServerSpec(name="x")
    with pytest.raises(ValueError, match="exactly one of url"):
        MCPServerSpec(name="x", url="http://a", command="b")
    with pytest.raises(ValueError, match="all_tools=True"):
        MCPTools(server="x")
    monkey = MCPServerSpec.http("x", "http://a", headers_from_env={"Authorization": "PICOFLOW_TEST_TOKEN"})
    os.environ.pop("PICOFLOW_TEST_TOKEN", None)
    assert monkey.resolved_headers() == {}


# -- headers from SSM ----------------------------------------------------------------------------------------

TOKEN = "Bearer ssm-token-5c2e9f1a77d4"


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """The test server over streamable HTTP, answering 401 unless the Authorization header is ``TOKEN``."""
    log = tmp_path_factory.mktemp("guarded") / "server.log"
    server = HttpServer("tests.support.mcp_test_server", log, env={"MCP_TEST_AUTHORIZATION": TOKEN}).start()
    yield server
    server.stop()


@pytest.fixture
def ssm(aws_credentials: None) -> Iterator[Any]:
    """Moto's SSM (the values read are kept per process, so every test names parameters of its own)."""
    with mock_aws():
        yield boto3.client("ssm", region_name=REGION)


def parameter_name() -> str:
    return f"/app/test/{uuid.uuid4().hex}/token"


async def test_an_http_servers_header_comes_from_ssm_read_at_the_first_connect_and_kept(
    guarded_server: HttpServer, ssm: Any
) -> None:
    add = {"a": 1, "b": 2}
    with pytest.raises(MCPUnavailableError):
        await SESSIONS.direct.call_tool(MCPServerSpec.http("bare", guarded_server.url, timeout=5), "add", add)

    name = parameter_name()
    # Declaring the server reads nothing: the parameter need not exist until the first connect.
    spec = MCPServerSpec.http("guarded", guarded_server.url, headers_from_ssm={"Authorization": name}, timeout=5)
    ssm.put_parameter(Name=name, Value=TOKEN, Type="SecureString")
    assert (await SESSIONS.direct.call_tool(spec, "add", add)).structured["total"] == 3

    # Kept for the container's life: a new session connects with the value read before.
    ssm.delete_parameter(Name=name)
    await SESSIONS.direct.close()
    assert (await SESSIONS.direct.call_tool(spec, "add", add)).structured["total"] == 3


async def test_an_unreadable_ssm_header_is_mcp_unavailable_and_names_no_value(
    guarded_server: HttpServer, ssm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    spec = MCPServerSpec.http("guarded", guarded_server.url, headers_from_ssm={"Authorization": parameter_name()})
    with pytest.raises(MCPUnavailableError) as caught:
        await SESSIONS.direct.call_tool(spec, "add", {"a": 1, "b": 2})
    assert (caught.value.reason, str(caught.value)) == (
        "headers_unavailable", "The MCP server 'guarded' is unavailable (headers_unavailable).")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    (record,) = [r for r in caplog.records if r.getMessage() == "MCP server headers could not be read"]
    assert (record.mcpServer, record.errorCode) == ("guarded", "ParameterNotFound")


async def test_an_ssm_header_never_reaches_logs_responses_or_the_session(
    guarded_server: HttpServer, ssm: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    # botocore's own DEBUG wire trace prints every response body, any SSM read's included: it is never left on.
    caplog.set_level(logging.INFO, logger="botocore")
    wrong = "Bearer wrong-token-0b8d4e"
    monkeypatch.setenv("MCP_TEST_URL", guarded_server.url)
    seen: list[str] = []
    for value, succeeds in ((TOKEN, True), (wrong, False)):
        name = parameter_name()
        ssm.put_parameter(Name=name, Value=value, Type="SecureString")
        monkeypatch.setenv("MCP_TEST_AUTHORIZATION_PARAMETER", name)
        run, _ = engine([call("sum_numbers", {"a": 1, "b": 2})])
        response = await run.run("McpFlow", "add")
        assert response.success is succeeds, response
        if not succeeds:
            assert (response.status_code, response.error_code) == (503, "MCP_UNAVAILABLE")
        seen += [json.dumps(response.model_dump(), default=str), json.dumps(response.envelope(), default=str)]
        if response.session:
            seen.append(json.dumps(await stored(run, response.session)))
        await run.mcp.close()
    out, err = capsys.readouterr()
    seen += [out, err, *(json.dumps(vars(record), default=str) for record in caplog.records)]
    assert any("MCP session opened" in text for text in seen), "the logs were captured"
    for secret in ("ssm-token-5c2e9f1a77d4", "wrong-token-0b8d4e"):
        assert not [text for text in seen if secret in text]


def test_the_example_flows_take_their_servers_authorization_from_ssm_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from picoflow.mcp.environment import server_from_env

    monkeypatch.setenv("HOTEL_MCP_URL", "https://hotels.example.com/mcp")
    monkeypatch.delenv("HOTEL_MCP_AUTHORIZATION_PARAMETER", raising=False)
    by_env = server_from_env("hotel", "HOTEL_MCP", "flows.hotel.mcp_server", timeout=10)
    assert (by_env.headers_from_env, by_env.headers_from_ssm) == ((("Authorization", "HOTEL_MCP_AUTHORIZATION"),), ())
    monkeypatch.setenv("HOTEL_MCP_AUTHORIZATION_PARAMETER", "/picoflow/hotel-mcp-token")
    by_ssm = server_from_env("hotel", "HOTEL_MCP", "flows.hotel.mcp_server", timeout=10)
    assert (by_ssm.headers_from_env, by_ssm.headers_from_ssm) == ((), (("Authorization", "/picoflow/hotel-mcp-token"),))


def test_a_flows_own_server_runs_from_the_folder_holding_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from picoflow.mcp.environment import package_root, server_from_env

    (tmp_path / "inn").mkdir()
    (tmp_path / "inn" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "lone.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for variable in ("INN_MCP_URL", "INN_MCP_COMMAND", "INN_MCP_CWD"):
        monkeypatch.delenv(variable, raising=False)
    assert package_root("inn.mcp_server") == package_root("lone") == str(tmp_path.resolve())
    spec = server_from_env("inn", "INN_MCP", "inn.mcp_server", timeout=5)
    assert (spec.args, spec.cwd, dict(spec.env)) == (
        ("-m", "inn.mcp_server"), str(tmp_path.resolve()), {"PYTHONPATH": str(tmp_path.resolve())})
    with pytest.raises(ModuleNotFoundError):
        package_root("no_such_package_here.server")
