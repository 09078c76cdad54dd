"""Hostile MCP servers, as separate processes over streamable HTTP and stdio: no shadowing of a flow's tools, a
turn that goes on when a server is down or dies, caps read while the answer arrives, and logs that quote nothing
a server sent."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from picoflow import FlowEngine
from picoflow.errors import PicoFlowError
from picoflow.mcp import UNAVAILABLE_TOOL_FEEDBACK, MCPServerSpec, MCPUnavailableError
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore
from tests.support.hostile_flow import ROOT, HostileFlow, ShadowedFlow
from tests.support.hostile_mcp_server import SECRET
from tests.support.mcp_servers import HttpServer, OpenedSessions, free_port

TRANSPORTS = ["http", "stdio"]
SESSIONS = OpenedSessions()
#: The hostile servers over HTTP, by what they do wrong (the stdio ones are started by the flow with these).
MISDEEDS = {"plain": {}, "described": {"HOSTILE_DESCRIPTION_BYTES": "1000000"}, "crowded": {"HOSTILE_TOOLS": "200"},
            "json": {"HOSTILE_JSON_RESPONSE": "1"}}


@pytest.fixture(scope="module")
def http_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, HttpServer]]:
    folder = tmp_path_factory.mktemp("hostile")
    servers = {name: HttpServer("tests.support.hostile_mcp_server", folder / f"{name}.log", env=env).start()
               for name, env in MISDEEDS.items()}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(autouse=True)
async def sessions_closed(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in [name for name in os.environ if name.startswith("HOSTILE_")]:
        monkeypatch.delenv(name)
    yield
    await SESSIONS.close()


def serve(transport: str, misdeed: str, servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Point HostileFlow at the hostile server doing ``misdeed`` over ``transport``."""
    if transport == "http":
        monkeypatch.setenv("HOSTILE_URL", servers[misdeed].url)
    else:
        for name, value in MISDEEDS[misdeed].items():
            monkeypatch.setenv(name, value)


def call(name: str, args: dict[str, Any], call_id: str = "c1") -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "args": args, "id": call_id}]}


def engine(script: list[dict[str, Any]]) -> tuple[FlowEngine, ScriptedProvider]:
    provider = ScriptedProvider(script)
    engine_ = FlowEngine(flows=[HostileFlow], session_store=MemorySessionStore(), providers=[provider])
    return SESSIONS.kept(engine_), provider


class RootRecords(logging.Handler):
    """Every record that reaches the root logger, where an application's handlers are (pytest's capture also
    hooks loggers that do not propagate, so it sees more than an application would)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def root_records(caplog: pytest.LogCaptureFixture) -> Iterator[RootRecords]:
    caplog.set_level(logging.DEBUG)
    # Another test may have configured PicoFlow's logger (the Lambda adapter sets its level): DEBUG here.
    caplog.set_level(logging.DEBUG, logger="picoflow")
    handler = RootRecords()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


# -- 1. flow tools always win ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_tool_named_like_a_flow_tool_is_left_out_and_the_flow_handles_the_call(
    transport: str, http_servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    serve(transport, "plain", http_servers, monkeypatch)
    run, provider = engine([call("save_note", {"text": "call me at 555-0100"}), {"content": "saved"}])
    response = await run.run("HostileFlow", "note my number")
    assert response.success, response
    offered = provider.tools[0]
    assert offered.count("save_note") == 1 and "echo" in offered, "the server's other tools are still offered"
    doc = (await run.session_store.load(response.session)).to_json_dict()
    assert doc["flow"]["steps"][0]["state"]["note"] == "call me at 555-0100", "the flow's handler got the call"
    assert provider.calls[1][-1].content == "note saved by the flow"
    assert SECRET not in json.dumps(doc)
    assert "MCP tool left out: the flow has a tool of that name" in messages(caplog)


def test_an_allow_list_naming_a_flow_tool_is_refused_when_the_flow_is_registered() -> None:
    with pytest.raises(PicoFlowError, match=r"ShadowingStep.*'save_note'.*one of the flow's own tools"):
        FlowEngine(flows=[ShadowedFlow], providers=[ScriptedProvider([])])


# -- 2. a server that is down or dies ----------------------------------------------------------------------------


def down(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if transport == "http":
        monkeypatch.setenv("HOSTILE_URL", f"http://127.0.0.1:{free_port()}/mcp")
    else:
        monkeypatch.setenv("HOSTILE_COMMAND", f"{sys.executable} -c 'raise SystemExit(3)'")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_that_is_down_leaves_its_tools_out_and_the_turn_goes_on(
    transport: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    down(transport, monkeypatch)
    run, provider = engine([{"content": "Hello!"}, call("echo", {"text": "x"}), {"content": "It is unavailable."}])
    first = await run.run("HostileFlow", "Hi", config={"start": "EchoStep"})
    assert first.success and first.message == "Hello!", first
    assert provider.tools[0] == [], "nothing of the server is offered"
    assert "MCP server's tools left out of the offer" in messages(caplog)
    # A model that calls an allow-listed tool anyway (it saw it earlier) gets the fixed sentence.
    second = await run.run("HostileFlow", "echo x", first.session)
    assert second.success and second.message == "It is unavailable."
    assert provider.calls[2][-1].content == UNAVAILABLE_TOOL_FEEDBACK


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_that_dies_mid_conversation_answers_the_fixed_sentence_and_the_turn_goes_on(
    transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root_records: RootRecords
) -> None:
    exit_file = tmp_path / "dead"
    server = None
    if transport == "http":
        server = HttpServer("tests.support.hostile_mcp_server", tmp_path / "server.log").start()
        monkeypatch.setenv("HOSTILE_URL", server.url)
    else:
        # Once the file exists, a restarted server exits at once: the reconnect fails too.
        monkeypatch.setenv("HOSTILE_EXIT_FILE", str(exit_file))
        monkeypatch.setenv("HOSTILE_NOISE", f"dying words {SECRET}")
    script = [call("where", {}), {"content": "alive"}, call("where", {}, "c2"), {"content": "gone"}]
    run, provider = engine(script)
    try:
        first = await run.run("HostileFlow", "where", config={"start": "EchoStep"})
        assert first.success and first.message == "alive", first
        pid = json.loads(provider.calls[1][-1].content)["pid"]
        exit_file.touch()
        if server is not None:
            server.stop()
        else:
            os.kill(pid, signal.SIGKILL)
        second = await run.run("HostileFlow", "where again", first.session)
    finally:
        if server is not None:
            server.stop()
    assert second.success and second.message == "gone", second
    assert provider.calls[3][-1].content == UNAVAILABLE_TOOL_FEEDBACK
    if transport == "stdio":
        exits = [r for r in root_records.records if r.getMessage() == "MCP server exited"]
        assert [(r.mcpCommand, r.exitStatus) for r in exits][-1] == (Path(sys.executable).name, 3)
    assert not [r for r in root_records.records if SECRET in json.dumps(vars(r), default=str)]


# -- 3. caps ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_tool_with_an_oversized_description_is_left_out(
    transport: str, http_servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    serve(transport, "described", http_servers, monkeypatch)
    run, provider = engine([{"content": "Hello"}])
    assert (await run.run("HostileFlow", "Hi")).success
    assert "described" not in provider.tools[0] and "echo" in provider.tools[0]
    (record,) = [r for r in caplog.records if "larger than max_description_bytes" in r.getMessage()]
    assert record.mcpTool == "described" and record.bytes > 1_000_000


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_listing_more_tools_than_the_cap_offers_none_and_the_turn_goes_on(
    transport: str, http_servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="picoflow")
    serve(transport, "crowded", http_servers, monkeypatch)
    run, provider = engine([{"content": "Hello"}])
    response = await run.run("HostileFlow", "Hi")
    assert response.success and response.message == "Hello"
    assert provider.tools[0] == ["save_note"], "only the flow's own tool"
    refused = [r for r in caplog.records if r.getMessage() == "MCP server's tools left out of the offer"]
    assert refused[0].reason == "too_many_tools"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_answer_over_the_byte_cap_is_refused_while_it_arrives_and_the_session_goes_on(
    transport: str, http_servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch, root_records: RootRecords,
) -> None:
    serve(transport, "plain", http_servers, monkeypatch)
    monkeypatch.setenv("HOSTILE_MAX_RESULT_BYTES", "100000")
    # About 1 MB of hotels for a handler, then for the model; then a small answer on the same server.
    script = [call("search", {"hotels": 5000}), {"content": "too big"},
              call("flood", {"hotels": 5000}, "c2"), {"content": "too big again"},
              call("flood", {"hotels": 3}, "c3"), {"content": "three"}]
    run, provider = engine(script)
    first = await run.run("HostileFlow", "search", config={"start": "SearchStep"})
    assert first.success and provider.calls[1][-1].content == "search unavailable (too_large)"
    second = await run.run("HostileFlow", "flood", config={"start": "EchoStep"})
    assert second.success and provider.calls[3][-1].content == UNAVAILABLE_TOOL_FEEDBACK
    third = await run.run("HostileFlow", "three", second.session)
    assert third.success and len(json.loads(provider.calls[5][-1].content)["hotels"]) == 3
    assert "MCP tool unavailable" in json.dumps((await run.session_store.load(second.session)).to_json_dict())
    assert not [r for r in root_records.records if SECRET in json.dumps(vars(r), default=str)]


@pytest.mark.parametrize("transport", ["http", "http-json", "stdio"])
async def test_call_tool_reports_an_oversized_answer_as_too_large(
    transport: str, http_servers: dict[str, HttpServer]
) -> None:
    # Over HTTP, as an event stream and as one JSON body (with its Content-Length).
    url = http_servers["json" if transport == "http-json" else "plain"].url
    spec = (MCPServerSpec.http("hostile", url, max_result_bytes=50_000) if transport.startswith("http")
            else MCPServerSpec.stdio("hostile", sys.executable, ["-m", "tests.support.hostile_mcp_server"],
                                     env={"PYTHONPATH": ROOT}, max_result_bytes=50_000))
    with pytest.raises(MCPUnavailableError) as caught:
        await SESSIONS.direct.call_tool(spec, "flood", {"hotels": 2000})
    assert caught.value.reason == "too_large"
    assert (await SESSIONS.direct.call_tool(spec, "echo", {"text": "still here"})).text == "still here"


# -- 4. logs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_nothing_a_server_prints_or_answers_reaches_the_logs(
    transport: str, http_servers: dict[str, HttpServer], monkeypatch: pytest.MonkeyPatch,
    root_records: RootRecords, capfd: pytest.CaptureFixture[str],
) -> None:
    serve(transport, "plain", http_servers, monkeypatch)
    # Over stdio, secret lines that are not JSON-RPC, at start and before every answer, on the JSON-RPC channel.
    monkeypatch.setenv("HOSTILE_NOISE", f"password={SECRET}")
    run, provider = engine([call("echo", {"text": f"tool output {SECRET}"}, "c1"), {"content": "done"}])
    response = await run.run("HostileFlow", "echo", config={"start": "EchoStep"})
    assert response.success, response
    assert provider.calls[1][-1].content == f"tool output {SECRET}", "the model still reads the result"
    # What the SDK itself would log about a bad message goes through the relay as a fixed sentence.
    try:
        raise ValueError(f"cannot parse {SECRET}")
    except ValueError:
        logging.getLogger("mcp.client.stdio").exception("Failed to parse %s", SECRET)
    records = [json.dumps(vars(record), default=str) for record in root_records.records]
    out, err = capfd.readouterr()
    assert not [text for text in [*records, out, err] if SECRET in text]
    assert "MCP SDK reported a problem" in [record.getMessage() for record in root_records.records]
    if transport == "stdio":
        noise = [r for r in root_records.records if r.getMessage().startswith("MCP server wrote a line")]
        # At start and before the answer: reported once, then counted at DEBUG.
        assert [r.levelname for r in noise] == ["WARNING", "DEBUG"] and noise[0].bytes > 0


# -- 5. stdio servers: working folder, environment, start failures ----------------------------------------------


async def test_a_stdio_server_runs_in_its_declared_folder_with_only_the_variables_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PICOFLOW_TEST_PASSED", "yes")
    monkeypatch.setenv("PICOFLOW_TEST_PRIVATE", "no")
    monkeypatch.chdir(tmp_path)
    spec = MCPServerSpec.stdio("hostile", sys.executable, ["-m", "tests.support.hostile_mcp_server"],
                               env={"PYTHONPATH": ROOT, "PICOFLOW_TEST_SET": "set"},
                               inherit_env=["PICOFLOW_TEST_PASSED", "PICOFLOW_TEST_UNSET"], cwd="work")
    assert spec.cwd == str(tmp_path / "work"), "a relative folder is read when declared"
    (tmp_path / "work").mkdir()
    where = (await SESSIONS.direct.call_tool(spec, "where")).structured
    assert where["cwd"] == str(tmp_path / "work")
    assert where["env"] == {"PICOFLOW_TEST_PASSED": "yes", "PICOFLOW_TEST_SET": "set"}

    default = MCPServerSpec.stdio("other", sys.executable, ["-m", "tests.support.hostile_mcp_server"],
                                  env={"PYTHONPATH": ROOT})
    where_default = (await SESSIONS.direct.call_tool(default, "where")).structured
    assert where_default["cwd"] == str(tmp_path), "the process's folder"


@pytest.mark.parametrize("command", ["missing", "exits"])
async def test_a_stdio_server_that_fails_to_start_logs_its_command_and_status_never_its_output(
    command: str, tmp_path: Path, root_records: RootRecords
) -> None:
    if command == "missing":
        spec = MCPServerSpec.stdio("broken", "no-such-mcp-server", ["--token", SECRET])
    else:
        script = f"import sys; print('{SECRET}'); print('{SECRET}', file=sys.stderr); raise SystemExit(7)"
        spec = MCPServerSpec.stdio("broken", sys.executable, ["-c", script])
    with pytest.raises(MCPUnavailableError) as caught:
        await SESSIONS.direct.call_tool(spec, "echo", {"text": "x"})
    assert caught.value.reason == "unreachable"
    if command == "missing":
        (record,) = [r for r in root_records.records if r.getMessage() == "MCP server could not be started"]
        assert (record.mcpCommand, record.errorType) == ("no-such-mcp-server", "FileNotFoundError")
    else:
        (record,) = [r for r in root_records.records if r.getMessage() == "MCP server exited"]
        assert (record.mcpCommand, record.exitStatus) == (Path(sys.executable).name, 7)
    assert not [r for r in root_records.records if SECRET in json.dumps(vars(r), default=str)]
