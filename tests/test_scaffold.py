"""``picoflow new NAME``: the project it writes, the names it refuses, and the project working end to end.

The end-to-end test follows a newcomer on a fresh clone: `make run` there, then `picoflow new` from that clone's
.venv in a folder outside it, then the commands it printed. The project installs PicoFlow from the wheel `picoflow
new` put in its wheels/ folder and everything else from the package registry.
"""

from __future__ import annotations

import base64
import email
import hashlib
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

import picoflow
from picoflow.local import cli, library_wheel, scaffold
from picoflow.local.scaffold import ScaffoldError, create_project, main, project_values
from tests.support.packaging import copy_into, run, user_home

# The longest name allowed: the generated code must stay within the line length with it.
LONG_NAME = "customer_support-ticket-triage-assistant"
EXPECTED_FILES = {
    ".gitignore",
    "Makefile",
    "README.md",
    "events/env.json",
    "events/run.json",
    "events/script.json",
    "flows/__init__.py",
    "flows/travel_desk/__init__.py",
    "flows/travel_desk/conversation.json",
    "flows/travel_desk/judge_script.json",
    "flows/travel_desk/scenario.json",
    "handlers/__init__.py",
    "handlers/api.py",
    "pyproject.toml",
    "requirements.txt",
    "samconfig.toml",
    "template.yaml",
    "tests/test_flow.py",
}


def files_under(root: Path) -> set[str]:
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_project("travel-desk", tmp_path_factory.mktemp("new"))


# -- what it writes --------------------------------------------------------------------------------------


def test_names_derive_the_package_flow_and_stack() -> None:
    assert project_values("travel-desk") | {"picoflow_version": ""} == {
        "project": "travel-desk",
        "package": "travel_desk",
        "flow": "TravelDeskFlow",
        "stack": "travel-desk",
        "picoflow_version": "",
    }
    assert project_values("my_bot")["stack"] == "my-bot"
    assert project_values("Bot2")["package"] == "bot2"
    assert project_values("ticketFlow")["flow"] == "TicketFlow"
    assert project_values("flow")["flow"] == "FlowFlow"


def test_the_project_has_every_file_and_no_placeholder_left(project: Path) -> None:
    assert project.name == "travel-desk"
    assert files_under(project) == EXPECTED_FILES
    for name in EXPECTED_FILES:
        assert "{{" not in (project / name).read_text(encoding="utf-8"), name
    assert (project / "handlers/api.py").read_text() == (
        'from picoflow.aws.api import app, lambda_handler\n\n__all__ = ["app", "lambda_handler"]\n'
    )


def test_pyproject_requires_this_picoflow_version_or_newer(project: Path) -> None:
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "travel-desk"
    assert meta["requires-python"] == ">=3.11"
    assert meta["dependencies"] == [f"picoflow-aws>={picoflow.__version__}"]
    dev = {re.split(r"[\[>=<]", requirement)[0] for requirement in meta["optional-dependencies"]["dev"]}
    assert dev == {"pytest", "pytest-asyncio", "moto", "ruff"}
    assert (project / "requirements.txt").read_text().split() == meta["dependencies"]


def test_a_local_version_label_is_left_out_of_the_requirement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaffold, "__version__", "0.3.0+g1234abc")
    assert project_values("travel-desk")["picoflow_version"] == "0.3.0"


def test_the_conversation_is_in_the_demo_format(project: Path) -> None:
    conversation = json.loads((project / "flows/travel_desk/conversation.json").read_text())
    assert conversation["flow"] == "TravelDeskFlow"
    assert isinstance(conversation["config"], dict)
    assert [set(turn) for turn in conversation["turns"]] == [{"user", "replies"}] * 2
    assert "class TravelDeskFlow(Flow):" in (project / "flows/travel_desk/__init__.py").read_text()
    replies = [reply for turn in conversation["turns"] for reply in turn["replies"]]
    assert [call["name"] for reply in replies for call in reply.get("tool_calls", [])] == ["save_name"]


def test_the_makefile_runs_the_demo_and_the_tests(project: Path) -> None:
    makefile = (project / "Makefile").read_text()
    assert re.search(r"^FLOW \?= TravelDeskFlow$", makefile, re.MULTILINE)
    assert "-m picoflow.local.demo --flow $(FLOW) --flows flows" in makefile
    assert re.search(r"^run: \$\(STAMP\)$", makefile, re.MULTILINE)
    assert re.search(r"^test: \$\(STAMP\)\n\t\$\(PY\) -m ruff check \.\n\t\$\(PY\) -m pytest$", makefile, re.MULTILINE)
    # The library from wheels/ when `picoflow new` put one there, else (and its dependencies) from the index.
    assert "FIND_WHEELS := $(if $(wildcard wheels/*.whl),--find-links wheels)" in makefile
    assert "$(PY) -m pip install --quiet $(FIND_WHEELS) -e '.[dev]'" in makefile
    assert "$(FIND_WHEELS) -r requirements.txt" in makefile and "PICOFLOW_WHEEL" not in makefile
    assert "sam build && sam deploy --guided" in (project / "README.md").read_text()


def test_the_sam_template_deploys_the_handler_and_a_retained_sessions_table(project: Path) -> None:
    template = cfn_yaml.load(str(project / "template.yaml"))
    resources = template["Resources"]
    assert [r["Type"] for r in resources.values()].count("AWS::Serverless::HttpApi") == 1
    (function,) = [r for r in resources.values() if r["Type"] == "AWS::Serverless::Function"]
    props = function["Properties"]
    assert props["Handler"] == "handlers.api.lambda_handler"
    assert props["Environment"]["Variables"]["PICOFLOW_FLOWS"] == "flows"
    # The stack's own table, unless RestoredTableName names a restored one.
    condition, restored, own = props["Environment"]["Variables"]["SESSION_TABLE"]["Fn::If"]
    assert (condition, restored) == ("HasRestoredTable", {"Ref": "RestoredTableName"})
    table = resources[own["Ref"]]
    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "expiresAt", "Enabled": True}
    # sam local only overrides the variables the template declares.
    local = json.loads((project / "events/env.json").read_text())
    assert set(local) == {"ApiFunction"} and set(local["ApiFunction"]) <= set(props["Environment"]["Variables"])
    assert set(resources) >= set(local)
    event = json.loads((project / "events/run.json").read_text())
    assert event["routeKey"] == "POST /ai/run" and json.loads(event["body"])["flowName"] == "TravelDeskFlow"
    samconfig = tomllib.loads((project / "samconfig.toml").read_text())["default"]
    assert samconfig["global"]["parameters"]["stack_name"] == "travel-desk"
    assert samconfig["local_invoke"]["parameters"]["env_vars"] == "events/env.json"
    # sam builds in the project's folder, as in the repository: no copy of its .venv, no checksum of it.
    repository = tomllib.loads((Path(__file__).resolve().parents[1] / "samconfig.toml").read_text())["default"]
    assert samconfig["build"]["parameters"] == repository["build"]["parameters"]
    assert samconfig["build"]["parameters"]["build_in_source"] is True


def test_the_generated_template_passes_cfn_lint(project: Path) -> None:
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    result = subprocess.run([str(cfn_lint), "template.yaml"], cwd=project, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_generated_python_compiles_and_is_ruff_clean(tmp_path: Path) -> None:
    # The longest allowed name makes the longest lines.
    long = create_project(LONG_NAME, tmp_path)
    sources = sorted(long.rglob("*.py"))
    assert len(sources) == 5
    for source in sources:
        py_compile.compile(str(source), cfile=str(tmp_path / "compiled.pyc"), doraise=True)
    # Run in the project, so ruff reads the project's own settings and sees flows/ and handlers/ as its own code.
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "."]
    result = subprocess.run(ruff, cwd=long, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- what it refuses -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "1st", "travel desk", "travel--desk", "-travel", "travel-", "travel.desk", "../travel", "réservation",
     "class", "picoflow-aws", "picoflow", "x" * 41],
)
def test_invalid_names_are_refused_before_anything_is_written(name: str, tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="name|keyword|PicoFlow library"):
        create_project(name, tmp_path / "parent")
    assert not (tmp_path / "parent").exists()


def test_a_non_empty_directory_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "travel-desk").mkdir()
    (tmp_path / "travel-desk" / "Makefile").write_text("mine")
    with pytest.raises(ScaffoldError, match="not an empty directory"):
        create_project("travel-desk", tmp_path)
    assert files_under(tmp_path / "travel-desk") == {"Makefile"}
    assert (tmp_path / "travel-desk" / "Makefile").read_text() == "mine"

    (tmp_path / "other").write_text("a file")
    with pytest.raises(ScaffoldError, match="not an empty directory"):
        create_project("other", tmp_path)


def test_an_empty_directory_and_a_missing_parent_are_fine(tmp_path: Path) -> None:
    (tmp_path / "travel-desk").mkdir()
    assert files_under(create_project("travel-desk", tmp_path)) == EXPECTED_FILES
    assert files_under(create_project("travel-desk", tmp_path / "a" / "b")) == EXPECTED_FILES


# -- the command -----------------------------------------------------------------------------------------


def printed_steps(printed: str) -> list[str]:
    """The commands of the block `picoflow new` prints after its first line, without their comments."""
    return [line.split("#", 1)[0].strip() for line in printed.split("\n\n")[1].splitlines()]


def test_main_creates_the_project_in_the_working_directory_with_this_picoflows_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["travel-desk"]) == 0
    wheel = f"wheels/picoflow_aws-{metadata.version('picoflow-aws')}-py3-none-any.whl"
    assert files_under(tmp_path / "travel-desk") == EXPECTED_FILES | {wheel}
    out = capsys.readouterr().out
    assert "TravelDeskFlow" in out and printed_steps(out) == ["cd travel-desk", "make run", "make test"]
    assert f"from {wheel},\nthe library you ran this command with" in out

    assert main(["travel-desk"]) == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_without_an_installed_distribution_the_project_is_written_for_the_package_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(library_wheel.metadata, "distribution", missing)
    monkeypatch.setattr(library_wheel.metadata, "distributions", lambda name: iter(()))
    assert main(["travel-desk", "--dir", str(tmp_path)]) == 0
    assert files_under(tmp_path / "travel-desk") == EXPECTED_FILES
    captured = capsys.readouterr()
    assert "picoflow-aws is not installed in this Python" in captured.err
    assert "make installs picoflow-aws>=" in captured.out and "from your package index." in captured.out


def test_the_wheel_picoflow_came_from_is_read_from_its_install_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "picoflow_aws-1.0.0-py3-none-any.whl"
    wheel.write_bytes(b"")

    class Installed:
        def __init__(self, record: str | None) -> None:
            self.record = record

        def read_text(self, name: str) -> str | None:
            return self.record if name == "direct_url.json" else None

    def installed_from(record: str | None) -> Path | None:
        monkeypatch.setattr(library_wheel.metadata, "distribution", lambda name: Installed(record))
        return library_wheel.installed_wheel()

    assert installed_from(json.dumps({"url": wheel.as_uri(), "archive_info": {}})) == wheel
    assert installed_from(None) is None  # from the package index: pip records nothing
    assert installed_from(json.dumps({"url": tmp_path.as_uri(), "dir_info": {"editable": True}})) is None
    assert installed_from(json.dumps({"url": (tmp_path / "gone.whl").as_uri()})) is None
    assert installed_from(json.dumps({"url": "https://example.invalid/picoflow_aws-1.0.0-py3-none-any.whl"})) is None
    assert installed_from("not json") is None


def test_a_picoflow_installed_from_a_wheel_gives_the_project_that_very_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "dist" / "picoflow_aws-1.0.0-py3-none-any.whl"
    source.parent.mkdir()
    source.write_bytes(b"the wheel")
    monkeypatch.setattr(library_wheel, "installed_wheel", lambda: source)
    assert main(["travel-desk", "--dir", str(tmp_path)]) == 0
    copied = tmp_path / "travel-desk" / "wheels" / source.name
    assert copied.read_bytes() == b"the wheel"


def test_the_wheel_written_from_an_installation_holds_what_a_build_of_the_sources_holds(
    tmp_path: Path, wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This test run's picoflow is an editable install of the checkout: the wheel is written from its files.
    monkeypatch.setattr(library_wheel, "installed_wheel", lambda: None)
    written = library_wheel.write_library_wheel(tmp_path / "a")
    assert written.name == wheel.name
    with zipfile.ZipFile(written) as ours, zipfile.ZipFile(wheel) as built:
        assert sorted(ours.namelist()) == sorted(built.namelist())
        name = next(n for n in ours.namelist() if n.endswith(".dist-info/METADATA"))
        # The installed metadata's fields (its description is the README as it was at install time).
        mine, theirs = (email.message_from_bytes(archive.read(name)) for archive in (ours, built))
        for field in ("Name", "Version", "Requires-Python", "License-Expression"):
            assert mine[field] == theirs[field], field
        assert sorted(mine.get_all("Requires-Dist")) == sorted(theirs.get_all("Requires-Dist"))
        entry_points = name.replace("METADATA", "entry_points.txt")
        assert ours.read(entry_points) == built.read(entry_points)
        # Every file's hash and size as RECORD states them, as pip checks at install time.
        record = ours.read(name.replace("METADATA", "RECORD")).decode().splitlines()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            if digest:
                data = ours.read(path)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={expected}", len(data)), path
    # The same installation gives the same bytes.
    assert library_wheel.write_library_wheel(tmp_path / "b").read_bytes() == written.read_bytes()


def test_main_takes_a_parent_directory_and_reports_a_bad_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ops-bot", "--dir", str(tmp_path / "projects")]) == 0
    assert (tmp_path / "projects" / "ops-bot" / "flows" / "ops_bot" / "__init__.py").is_file()
    assert main(["ops bot", "--dir", str(tmp_path)]) == 2
    assert "picoflow new: error: 'ops bot' is not a valid project name" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert main(["ops-bot", "--dir", str(tmp_path / "a-file")]) == 1
    assert "Not a directory" in capsys.readouterr().err


def test_the_picoflow_command_has_a_new_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["new", "travel-desk", "--dir", str(tmp_path)]) == 0
    assert files_under(tmp_path / "travel-desk") - EXPECTED_FILES == {
        f"wheels/picoflow_aws-{metadata.version('picoflow-aws')}-py3-none-any.whl"
    }
    assert "TravelDeskFlow" in capsys.readouterr().out
    assert cli.main(["new", "travel-desk", "--dir", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err


# -- a fresh clone: `make run`, `picoflow new` elsewhere, then only what it printed and the project's README say -----


@dataclass(frozen=True)
class Walkthrough:
    checkout: Path
    project: Path
    printed: str  # what `picoflow new` printed
    steps: list[str]  # the commands it printed, in order
    output: str  # what running them printed


def clean_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: nothing of this test run (no PYTHONPATH, no AWS settings) but pip's own."""
    pip = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONNOUSERSITE": "1",
            "LANG": "C.UTF-8", **pip}


@pytest.fixture(scope="module")
def make() -> str:
    found = shutil.which("make")
    if found is None:
        reason = "make is not installed: the generated project's Makefile cannot run"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def walkthrough(make: str, tmp_path_factory: pytest.TempPathFactory) -> Walkthrough:
    base = tmp_path_factory.mktemp("fresh")
    env = clean_env(user_home(base / "home"))
    # A clone's files; `make run` there makes .venv with the library installed editable, as the README says.
    checkout = copy_into(base / "checkout", [
        "Makefile", "pyproject.toml", "README.md", "LICENSE", "picoflow", "handlers", "flows", "events"
    ])
    run([make, "--no-print-directory", "run"], cwd=checkout, env=env, timeout=900)
    # `picoflow new` from that .venv, in a folder outside the clone, with no variable set.
    new = run([str(checkout / ".venv" / "bin" / "picoflow"), "new", "travel-desk"], cwd=base, env=env)
    steps = printed_steps(new.stdout)
    # The printed commands exactly as printed, in one shell: the project's own .venv, nothing prepared for it.
    done = run(["bash", "-euc", "\n".join(steps)], cwd=base, env=env, timeout=900)
    return Walkthrough(checkout, base / "travel-desk", new.stdout, steps, done.stdout + done.stderr)


def test_picoflow_new_prints_the_steps_and_gives_the_project_the_library(walkthrough: Walkthrough) -> None:
    assert walkthrough.steps == ["cd travel-desk", "make run", "make test"]
    (wheel,) = (walkthrough.project / "wheels").glob("picoflow_aws-*-py3-none-any.whl")
    assert f"from wheels/{wheel.name},\nthe library you ran this command with" in walkthrough.printed


def test_the_new_project_runs_its_demo_and_passes_its_tests_as_printed(walkthrough: Walkthrough) -> None:
    out = walkthrough.output
    assert "bot > Hello! I'm the travel-desk assistant." in out
    assert "bot > Nice to meet you, Ada!" in out
    assert "(session completed)" in out and "currentStep=AnswerStep" in out
    assert "All checks passed!" in out
    assert re.search(r"\b3 passed\b", out), out[-3000:]
    # Quiet installs: no setuptools notice box, no pip progress.
    assert "!!" not in out and "Warning" not in out, out


def test_the_project_installed_the_library_from_its_wheels_folder(walkthrough: Walkthrough) -> None:
    probe = (
        "import importlib.metadata as m, picoflow, flows, handlers.api as api\n"
        "print(picoflow.__file__, flows.__file__, api.__file__)\n"
        "print(m.version('picoflow-aws'), m.distribution('picoflow-aws').read_text('direct_url.json'))\n"
    )
    python = walkthrough.project / ".venv" / "bin" / "python"
    result = run([str(python), "-c", probe], cwd=walkthrough.project, env=clean_env(walkthrough.project))
    files, origin = result.stdout.splitlines()
    library, flows, handlers = files.split()
    assert Path(library).is_relative_to(walkthrough.project / ".venv")
    assert Path(flows).is_relative_to(walkthrough.project) and Path(handlers).is_relative_to(walkthrough.project)
    # Found by --find-links like an index's file (pip records no direct URL), at the clone's version.
    assert origin == f"{metadata.version('picoflow-aws')} None"


def test_the_generated_readme_explains_the_wheel_and_the_scripted_conversation(walkthrough: Walkthrough) -> None:
    readme = (walkthrough.project / "README.md").read_text()
    assert "The library comes from `wheels/`" in readme and "PICOFLOW_WHEEL" not in readme
    assert "## The scripted conversation" in readme
    for example in ('"tool_calls": [{"name": "save_name"', '{"for": "decision"', '{"for": "summary"'):
        assert example in readme
    assert "make run FLOW=" in readme


def test_make_eval_prints_the_progress_and_the_table_without_log_lines(walkthrough: Walkthrough, make: str) -> None:
    project = walkthrough.project
    result = run([make, "--no-print-directory", "eval"], cwd=project, env=clean_env(project))
    out = result.stdout + result.stderr
    assert "TravelDeskFlow turn 1/2 greeting: pass" in out and out.rstrip().endswith("passed")
    assert re.search(r"^turn +label +score +pass", out, re.MULTILINE)
    # Neither the handler's JSON log lines nor its metrics.
    assert '{"level"' not in out and '"_aws"' not in out, out


def test_make_run_replays_any_flow_of_the_project(walkthrough: Walkthrough, make: str) -> None:
    project = walkthrough.project
    second = project / "flows" / "front_desk"
    second.mkdir()
    (second / "__init__.py").write_text(
        "from flows.travel_desk import TravelDeskFlow\n\n\nclass FrontDeskFlow(TravelDeskFlow):\n    pass\n"
    )
    conversation = json.loads((project / "flows/travel_desk/conversation.json").read_text())
    conversation["turns"][0]["replies"][0]["content"] = "Welcome to the front desk! What is your first name?"
    (second / "conversation.json").write_text(json.dumps({**conversation, "flow": "FrontDeskFlow"}))

    result = run([make, "--no-print-directory", "run", "FLOW=FrontDeskFlow"], cwd=project, env=clean_env(project))
    assert "PicoFlow demo: FrontDeskFlow" in result.stdout
    assert "bot > Welcome to the front desk!" in result.stdout and "(session completed)" in result.stdout


def test_the_sample_event_runs_through_the_handler_as_sam_local_would(walkthrough: Walkthrough) -> None:
    project = walkthrough.project
    code = (
        "import json, os\n"
        # The project folder stands for /var/task, where the build puts the function's code and events/script.json.
        "env = json.load(open('events/env.json'))['ApiFunction']\n"
        "os.environ.update({k: v.replace('/var/task', os.getcwd(), 1) for k, v in env.items()})\n"
        "from picoflow.aws.apigw import FakeLambdaContext\n"
        "from handlers.api import lambda_handler\n"
        "response = lambda_handler(json.load(open('events/run.json')), FakeLambdaContext())\n"
        "print('RESPONSE', json.dumps(response))\n"
    )
    python = project / ".venv" / "bin" / "python"
    result = run([str(python), "-c", code], cwd=project, env={**clean_env(project), "AWS_DEFAULT_REGION": "us-east-1"})
    response = json.loads(result.stdout.split("RESPONSE ", 1)[1])
    assert response["statusCode"] == 200, response
    script = json.loads((project / "events/script.json").read_text())
    assert json.loads(response["body"])["message"] == script[0]["content"]


# What the repository's template has and a new project's deliberately has not (docs/operating/production.md names
# each): the bundled examples' settings (their flow modules, the hotel MCP server, a Bedrock model), the files
# bucket, CORS, SnapStart and the WebSocket API with its alarms.
LEFT_OUT_PARAMETERS = {
    "FlowsModule", "HotelMcpUrl", "HotelMcpAuthorizationParameterName", "BedrockModelId", "FileRetentionDays",
    "CorsAllowOrigins", "CorsMaxAgeSeconds", "EnableSnapStart", "EnableWebSocketApi", "AllowAnonymousWebSocket",
    "EnableWebSocketAccessLogs", "WebSocketMemorySize", "WebSocketTimeout", "WebSocketReservedConcurrency",
}
LEFT_OUT_ALARMS = {
    "WebSocketApiErrorsAlarm", "WebSocketFunctionErrorsAlarm", "WebSocketFunctionThrottlesAlarm",
    "WebSocketFunctionDurationAlarm",
}


def test_the_generated_template_matches_the_repositorys_for_production(project: Path) -> None:
    main = cfn_yaml.load(str(Path(__file__).resolve().parents[1] / "template.yaml"))
    generated = cfn_yaml.load(str(project / "template.yaml"))
    assert generated["Transform"] == main["Transform"]
    # Every parameter but the deliberate subset, each with the repository's type, default and constraints (the
    # descriptions may point to PicoFlow's pages instead of the repository's files; the key's name is the project's).
    assert set(main["Parameters"]) - set(generated["Parameters"]) == LEFT_OUT_PARAMETERS
    assert set(generated["Parameters"]) <= set(main["Parameters"])
    for name, parameter in generated["Parameters"].items():
        if name != "OpenAIKeyParameterName":
            assert {k: v for k, v in parameter.items() if k != "Description"} == {
                k: v for k, v in main["Parameters"][name].items() if k != "Description"}, name
    for name, condition in generated["Conditions"].items():
        assert condition == main["Conditions"][name], name
    assert {"HasAlarmTopic", "HasKmsKey", "HasRestoredTable", "HasReservedConcurrency"} <= set(generated["Conditions"])
    assert generated["Rules"]["JwtSettingsComeTogether"] == main["Rules"]["JwtSettingsComeTogether"]

    def alarms(template: dict) -> dict:
        # Descriptions aside: the repository's may speak of its WebSocket API as well.
        return {name: {**r, "Properties": {k: v for k, v in r["Properties"].items() if k != "AlarmDescription"}}
                for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}

    # Every alarm of the HTTP path, turns, spend, 429s and the table, each as the repository's; only the WebSocket
    # API's are missing.
    assert set(alarms(main)) - set(alarms(generated)) == LEFT_OUT_ALARMS
    assert all(alarm == alarms(main)[name] for name, alarm in alarms(generated).items())
    assert generated["Resources"]["ApiThrottledRequestsMetric"] == main["Resources"]["ApiThrottledRequestsMetric"]
    assert generated["Resources"]["KeyDecryptPolicy"]["Condition"] == "HasKmsKey"
    assert generated["Resources"]["KeyDecryptPolicy"]["Properties"]["PolicyDocument"] == (
        main["Resources"]["KeyDecryptPolicy"]["Properties"]["PolicyDocument"])

    # The dashboard is the repository's without the WebSocket API's lines.
    def widgets(template: dict) -> list[dict]:
        body, _ = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
        parsed: list[dict] = json.loads(body)["widgets"]
        for properties in (widget["properties"] for widget in parsed if "metrics" in widget["properties"]):
            properties["metrics"] = [row for row in properties["metrics"] if "WebSocket" not in json.dumps(row)]
        return parsed

    assert widgets(generated) == widgets(main)
    _, variables = generated["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    assert variables == {"SessionsTableInUse": main["Resources"]["Dashboard"]["Properties"]["DashboardBody"][
        "Fn::Sub"][1]["SessionsTableInUse"]}
    assert "DashboardUrl" in generated["Outputs"]
    # The production page names every parameter a project leaves out.
    page = (Path(__file__).resolve().parents[1] / "docs" / "operating" / "production.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in page for name in LEFT_OUT_PARAMETERS)

    def function(template: dict) -> dict:
        # The HTTP API's function; the repository's template may also hold the WebSocket API's.
        functions = {k: r for k, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}
        return functions.get("ApiFunction", next(iter(functions.values())))["Properties"]

    for key in ("MemorySize", "Timeout", "Tracing", "ReservedConcurrentExecutions"):
        assert function(generated)[key] == function(main)[key], key
    for template in (generated, main):
        log_group = template["Resources"][function(template)["LoggingConfig"]["LogGroup"]["Ref"]]
        retention = log_group["Properties"]["RetentionInDays"]
        if retention == {"Ref": "LogRetentionDays"}:
            retention = template["Parameters"]["LogRetentionDays"]["Default"]
        assert retention == 30
    table = generated["Resources"]["SessionsTable"]
    main_table = main["Resources"]["SessionsTable"]
    for key in ("PointInTimeRecoverySpecification", "SSESpecification", "DeletionProtectionEnabled",
                "AttributeDefinitions", "GlobalSecondaryIndexes"):
        assert table["Properties"][key] == main_table["Properties"][key], key

    def api(template: dict) -> dict:
        (props,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::HttpApi"]
        return props

    assert api(generated)["Auth"] == api(main)["Auth"]
    assert api(generated)["AccessLogSettings"] == api(main)["AccessLogSettings"]
    assert api(generated)["DefaultRouteSettings"] == api(main)["DefaultRouteSettings"]

    # What the parameters and alarms rely on reaches the function as in the repository's: the metrics' namespace,
    # the key's max age, the reviewer group, a restored table, and the routes and grants of reviews and erasure.
    variables = function(generated)["Environment"]["Variables"]
    for name in ("SESSION_TABLE", "PICOFLOW_REVIEWER_GROUP", "PICOFLOW_PARAMETER_MAX_AGE",
                 "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL", "OPENAI_API_KEY_PARAMETER"):
        assert variables[name] == function(main)["Environment"]["Variables"][name], name

    def statements(template: dict) -> dict:
        # An action may be written alone or in a list of one; a statement under a condition is read as granted.
        granted = [statement["Fn::If"][1] if "Fn::If" in statement else statement
                   for statement in function(template)["Policies"][0]["Statement"]]
        return {statement["Sid"]: {**statement, "Action": sorted(statement["Action"]) if isinstance(
                    statement["Action"], list) else [statement["Action"]]}
                for statement in granted}

    for sid in ("SessionItems", "PendingReviews", "OwnerIndex", "ReadOpenAIKey"):
        assert statements(generated)[sid] == statements(main)[sid], sid
    for event in ("Run", "End", "Flows", "Health", "Review", "Reviews", "EraseMe"):
        assert function(generated)["Events"][event] == function(main)["Events"][event], event
