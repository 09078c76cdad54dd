"""``picoflow eval``: scenario files in the original's format, run through the Lambda handler or a URL and judged."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import junitparser
import pytest

from picoflow.aws import runtime as aws_runtime
from picoflow.local import cli
from picoflow.local.evaluation import RunResult
from picoflow.local.judge import DEFAULT_PROMPT_PATH
from picoflow.local.scaffold import create_project
from picoflow.local.scenario import Scenario, load_scenario
from picoflow.local.serve import make_server
from tests.support.fake_openai import FakeOpenAIServer, chat_completion, usage_block

ROOT = Path(__file__).resolve().parent.parent
HOTEL = ROOT / "flows" / "hotel"
ORIGINAL_FORMAT = ROOT / "tests" / "fixtures" / "original_format_hotel_scenario.json"
# What the handler and the judge read from the environment; each test starts without them and gets them back after.
_ENVIRONMENT = (
    "PICOFLOW_SCRIPT", "PICOFLOW_FLOWS", "SESSION_STORE", "OPENAI_API_KEY", "OPENAI_BASE_URL",
    "OPENAI_API_KEY_PARAMETER", "POWERTOOLS_METRICS_DISABLED", "POWERTOOLS_LOG_LEVEL",
)


@pytest.fixture(autouse=True)
def fresh_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example application's handler with a runtime built anew from this test's environment."""
    for name in _ENVIRONMENT:
        # Set first so that teardown restores each one, including those picoflow eval sets itself.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    # The original's files carry no config: HotelFlow's date comes from the variable, as in the original's runner.
    monkeypatch.setenv("HOTEL_FLOW_CURRENT_DATE", "2026-03-22")
    monkeypatch.setattr(aws_runtime, "_runtime", None)
    yield
    _stop_runtime()


def _stop_runtime() -> None:
    if aws_runtime._runtime is not None:
        aws_runtime._runtime.loop.call_soon_threadsafe(aws_runtime._runtime.loop.stop)
        aws_runtime._runtime = None


def verdicts(*scores: float) -> list[dict[str, Any]]:
    """Scripted judge replies, one per turn, in order."""
    return [{"for": "judge", "content": {"score": score, "reason": f"Verdict {index + 1}."}}
            for index, score in enumerate(scores)]


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def evaluate(tmp_path: Path, scenario: Path, *options: str, judge: list[dict[str, Any]] | None = None,
             script: Path | None = HOTEL / "conversation.json") -> tuple[int, dict[str, Any]]:
    """Run ``picoflow eval`` in process; its exit status and its JSON report."""
    report = tmp_path / "report.json"
    arguments = ["eval", str(scenario), "--json", str(report), *options]
    if script is not None:
        arguments += ["--script", str(script)]
    if judge is not None:
        arguments += ["--judge", "scripted", "--judge-script", str(write_json(tmp_path / "judge.json", judge))]
    status = cli.main(arguments)
    return status, json.loads(report.read_text(encoding="utf-8"))


def turns_of(report: dict[str, Any], run: int = 0) -> list[dict[str, Any]]:
    return report["scenarios"][0]["runs"][run]["turns"]


# -- the format --------------------------------------------------------------------------------------------------


def test_the_originals_format_is_accepted_byte_for_byte() -> None:
    raw = ORIGINAL_FORMAT.read_bytes()
    document = json.loads(raw)
    assert set(document) == {"flowName", "judgeModel", "judgeMinScore", "turns"}
    assert {frozenset(turn) for turn in document["turns"]} == {
        frozenset({"label", "input", "expectedResponse", "completed"}),
        frozenset({"label", "input", "expectedResponse", "completed", "minScore"}),
    }

    scenario = load_scenario(ORIGINAL_FORMAT)

    assert isinstance(scenario, Scenario) and scenario.flow_name == "HotelFlow" and len(scenario.turns) == 14
    assert [scenario.min_score(turn) for turn in scenario.turns].count(0.8) == 1
    assert scenario.min_score(scenario.turns[0]) == 0.75
    assert scenario.turns[-1].completed is True and scenario.judge_model == "gpt-4o"


def test_a_malformed_scenario_is_refused_with_where_and_exit_status_2(tmp_path: Path, capsys) -> None:
    document = json.loads(ORIGINAL_FORMAT.read_text())
    document["turns"][2]["minscore"] = 0.9
    bad = write_json(tmp_path / "bad.json", document)

    assert cli.main(["eval", str(bad)]) == 2
    assert "turns.2.minscore" in capsys.readouterr().err


# -- offline runs through the Lambda handler -------------------------------------------------------------------


def test_a_scenario_in_the_originals_format_passes_against_hotelflow_offline(tmp_path: Path, capsys) -> None:
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, judge=verdicts(*[0.9] * 14))

    assert status == 0
    assert report["passed"] is True
    turns = turns_of(report)
    assert [turn["passed"] for turn in turns] == [True] * 14
    assert turns[-1]["checks"] == [{"name": "completed", "passed": True, "expected": True, "actual": True}]
    assert "Hilton Garden Inn Wilsonville Portland" in turns[-1]["reply"]
    assert all(turn["flowTokens"] > 0 for turn in turns)
    output = capsys.readouterr().out
    # A live line per turn, then the table with its columns.
    assert "HotelFlow turn 1/14 eligibility question: pass, score 0.90 (min 0.75)" in output
    assert "turn  label" in output and "latency  tokens" in output and output.rstrip().endswith("passed")


def test_a_score_under_the_minimum_fails_that_turn_and_the_exit_status_is_1(tmp_path: Path, capsys) -> None:
    scores = [0.9] * 14
    scores[2] = 0.4
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, judge=verdicts(*scores))

    assert status == 1
    turns = turns_of(report)
    assert [turn["index"] for turn in turns if not turn["passed"]] == [3]
    assert turns[2]["score"] == 0.4 and turns[2]["reason"] == "Verdict 3."
    assert "FAILED: 1 of 14 turns" in capsys.readouterr().out


def test_a_wrong_completed_flag_fails_the_turn_whatever_the_judge_says(tmp_path: Path) -> None:
    document = json.loads(ORIGINAL_FORMAT.read_text())
    document["turns"][-1]["completed"] = False
    scenario = write_json(tmp_path / "scenario.json", document)

    status, report = evaluate(tmp_path, scenario, judge=verdicts(*[1.0] * 14))

    assert status == 1
    last = turns_of(report)[-1]
    assert last["score"] == 1.0 and last["passed"] is False
    assert last["checks"][0] == {"name": "completed", "passed": False, "expected": False, "actual": True}


def test_a_turns_min_score_overrides_the_files(tmp_path: Path) -> None:
    scores = [0.9] * 14
    scores[10] = 0.78  # turn 11 asks for 0.8
    scores[11] = 0.76  # turn 12 keeps the file's 0.75
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, judge=verdicts(*scores))

    assert status == 1
    turns = turns_of(report)
    assert (turns[10]["minScore"], turns[10]["passed"]) == (0.8, False)
    assert (turns[11]["minScore"], turns[11]["passed"]) == (0.75, True)


def test_the_extension_checks_read_the_session_document(tmp_path: Path) -> None:
    document = json.loads(ORIGINAL_FORMAT.read_text())
    document["turns"][7].update(step="PresentStep", contentType="text/plain")
    document["turns"][8]["state"] = {
        "ExploreStep.criteria.room_type": "two beds", "ExploreStep.criteria.max_price": 700,
    }
    document["turns"][9]["step"] = "PresentStep"  # wrong: the comparison moved the flow to CompareStep
    scenario = write_json(tmp_path / "scenario.json", document)

    status, report = evaluate(tmp_path, scenario, judge=verdicts(*[1.0] * 14))

    assert status == 1
    turns = turns_of(report)
    assert [check["passed"] for check in turns[7]["checks"]] == [True, True, True]
    assert [check["passed"] for check in turns[8]["checks"]] == [True, True, True]
    assert turns[9]["checks"][1] == {
        "name": "step", "passed": False, "expected": "PresentStep", "actual": "CompareStep",
    }
    assert [turn["index"] for turn in turns if not turn["passed"]] == [10]


def test_repeat_reports_each_turns_pass_rate_and_score_spread(tmp_path: Path, capsys) -> None:
    # One judge script for three runs; the flow's script of one run is replayed for each.
    runs = [[0.9] * 14, [0.9] * 14, [0.9] * 14]
    runs[1][4] = 0.5
    runs[2][4] = 0.8
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, "--repeat", "3", judge=verdicts(*sum(runs, [])))

    assert status == 1
    scenario = report["scenarios"][0]
    assert [run["run"] for run in scenario["runs"]] == [1, 2, 3]
    assert [run["passed"] for run in scenario["runs"]] == [True, False, True]
    fifth = scenario["summary"][4]
    assert (fifth["runs"], fifth["passed"], fifth["passRate"]) == (3, 2, 0.6667)
    assert (fifth["minScore"], fifth["maxScore"], fifth["meanScore"]) == (0.5, 0.9, 0.7333)
    assert fifth["scoreStdev"] == pytest.approx(0.1700, abs=1e-4)
    assert scenario["summary"][0]["passRate"] == 1.0 and scenario["summary"][0]["scoreStdev"] == 0.0
    output = capsys.readouterr().out
    assert "HotelFlow run 2/3 turn 5/14" in output
    assert "0.73 (0.50-0.90, sd 0.17)  2/3" in output


def test_the_json_and_junit_reports_validate(tmp_path: Path) -> None:
    scores = [0.9] * 14
    scores[5] = 0.3
    junit = tmp_path / "report.xml"
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, "--junit", str(junit), judge=verdicts(*scores))

    assert status == 1
    scenario = report["scenarios"][0]
    assert (scenario["flowName"], scenario["judge"], scenario["passed"]) == ("HotelFlow", "scripted:judge", False)
    run = RunResult.model_validate(scenario["runs"][0])
    assert len(run.turns) == 14 and not run.passed

    xml = junitparser.JUnitXml.fromfile(str(junit))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert (suite.tests, suite.failures, suite.errors) == (14, 1, 0)
    cases = list(suite)
    assert [case.name for case in cases][:2] == ["01 eligibility question", "02 dates question"]
    failed = [case for case in cases if not case.is_passed]
    assert [case.name for case in failed] == ["06 distance question"]
    assert isinstance(failed[0].result[0], junitparser.Failure)
    assert "score 0.30 under the minimum 0.75" in failed[0].result[0].message


def test_the_bundled_flows_scenarios_pass_offline(tmp_path: Path) -> None:
    for package in ("hotel", "home_insurance", "basic", "invoice", "support", "refunds"):
        folder = ROOT / "flows" / package
        assert load_scenario(folder / "scenario.json").turns
        status = cli.main(["eval", str(folder / "scenario.json"), "--script", str(folder / "conversation.json"),
                           "--judge", "scripted", "--judge-script", str(folder / "judge_script.json")])
        assert status == 0, package
        _stop_runtime()  # the next flow's script is read by a handler runtime built anew


# -- over HTTP ----------------------------------------------------------------------------------------------------


def test_url_against_picoflow_serve_gives_the_same_results_as_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = HOTEL / "scenario.json"
    judge = json.loads((HOTEL / "judge_script.json").read_text())
    in_process_status, in_process = evaluate(tmp_path, scenario, judge=judge)
    _stop_runtime()

    replies = [reply for turn in json.loads((HOTEL / "conversation.json").read_text())["turns"]
               for reply in turn["replies"]]
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(write_json(tmp_path / "flow.json", replies)))
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    server = make_server("127.0.0.1", 0, inspector=True)
    server.access_log = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        over_http_status, over_http = evaluate(tmp_path, scenario, "--url", server.url, judge=judge, script=None)
    finally:
        server.shutdown()
        server.server_close()

    assert in_process_status == over_http_status == 0

    def comparable(report: dict[str, Any]) -> list[dict[str, Any]]:
        # Timings differ, and so does the booking's random confirmation number.
        return [{**{key: value for key, value in turn.items() if key != "latencyMs"},
                 "reply": re.sub(r"Confirmation number: \d+", "Confirmation number: N", turn["reply"])}
                for turn in turns_of(report)]

    assert comparable(over_http) == comparable(in_process)
    # The step and state checks were made over HTTP too: picoflow serve answers GET /ai/session.
    assert all(check["passed"] is True for turn in turns_of(over_http) for check in turn["checks"])
    assert sum(len(turn["checks"]) for turn in turns_of(over_http)) > 14


def test_a_deployed_api_without_the_session_route_leaves_step_and_state_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = [reply for turn in json.loads((HOTEL / "conversation.json").read_text())["turns"]
               for reply in turn["replies"]]
    monkeypatch.setenv("PICOFLOW_SCRIPT", str(write_json(tmp_path / "flow.json", replies)))
    server = make_server("127.0.0.1", 0, inspector=False)
    server.access_log = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, report = evaluate(tmp_path, HOTEL / "scenario.json", "--url", server.url,
                                  judge=json.loads((HOTEL / "judge_script.json").read_text()), script=None)
    finally:
        server.shutdown()
        server.server_close()

    assert status == 0
    turns = turns_of(report)
    unchecked = [check for turn in turns for check in turn["checks"] if check["passed"] is None]
    assert {check["name"] for check in unchecked} >= {"step", "state ExploreStep.criteria.room_type"}
    assert all(turn["flowTokens"] is None for turn in turns)


def test_the_report_names_the_judge_that_answered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --judge-script alone: the scenario's judgeModel (an OpenAI model) is selected, and the script answers.
    judge = write_json(tmp_path / "judge.json", verdicts(*[0.9] * 14))
    status, report = evaluate(tmp_path, ORIGINAL_FORMAT, "--judge-script", str(judge))
    assert status == 0
    selected = json.loads(ORIGINAL_FORMAT.read_text())["judgeModel"]
    assert report["scenarios"][0]["judge"] == f"scripted (in place of openai:{selected})"
    assert f"judge scripted (in place of openai:{selected})" in capsys.readouterr().out


def test_the_judge_asks_an_openai_compatible_server_for_a_structured_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = json.loads(ORIGINAL_FORMAT.read_text())
    document["turns"] = document["turns"][:2]
    scenario = write_json(tmp_path / "scenario.json", document)
    answers = [
        chat_completion(content=json.dumps({"score": 0.92, "reason": "It limits the offer to Portland."}),
                        usage=usage_block(410, 18)),
        chat_completion(content=json.dumps({"score": 0.6, "reason": "It never asks for the dates."}),
                        usage=usage_block(420, 15)),
    ]
    with FakeOpenAIServer(answers) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        status, report = evaluate(tmp_path, scenario, "--judge", "openai:gpt-4o-mini")

    assert status == 1
    first, second = turns_of(report)
    assert (first["score"], first["reason"], first["passed"], first["judgeTokens"]) == (
        0.92, "It limits the offer to Portland.", True, 428)
    assert (second["score"], second["passed"]) == (0.6, False)
    assert report["scenarios"][0]["judge"] == "openai:gpt-4o-mini"
    request = server.requests[0]
    assert request["model"] == "gpt-4o-mini" and request["temperature"] == 0
    assert request["response_format"]["type"] == "json_schema"
    assert set(request["response_format"]["json_schema"]["schema"]["properties"]) == {"score", "reason"}
    system, user = request["messages"]
    assert system == {"role": "system", "content": DEFAULT_PROMPT_PATH.read_text(encoding="utf-8").strip()}
    case = json.loads(user["content"])
    assert case["userMessage"] == "Hi" and case["turn"] == "eligibility question"
    assert case["expectedBehaviour"] == document["turns"][0]["expectedResponse"]
    assert "Portland" in case["actualReply"]


def test_an_unusable_verdict_fails_the_turn_with_the_reason(tmp_path: Path) -> None:
    document = json.loads(ORIGINAL_FORMAT.read_text())
    document["turns"] = document["turns"][:1]
    scenario = write_json(tmp_path / "scenario.json", document)

    status, report = evaluate(tmp_path, scenario, judge=[{"for": "judge", "content": {"score": 7, "reason": "?"}}])

    assert status == 1
    turn = turns_of(report)[0]
    assert turn["score"] is None and "not a verdict" in turn["reason"]


def test_a_new_project_has_a_scenario_its_judge_script_and_a_make_eval_target(tmp_path: Path) -> None:
    project = create_project("travel-desk", tmp_path)

    scenario = load_scenario(project / "flows/travel_desk/scenario.json")
    assert scenario.flow_name == "TravelDeskFlow" and scenario.turns[-1].completed
    conversation = json.loads((project / "flows/travel_desk/conversation.json").read_text())
    assert [turn.input for turn in scenario.turns] == [turn["user"] for turn in conversation["turns"]]
    judge = json.loads((project / "flows/travel_desk/judge_script.json").read_text())
    assert len(judge) == len(scenario.turns) and all(reply["for"] == "judge" for reply in judge)
    makefile = (project / "Makefile").read_text()
    assert "\neval: $(STAMP)\n" in makefile and "picoflow eval $$scenario" in makefile


def test_an_api_that_does_not_answer_fails_the_first_turn_and_ends_the_run(tmp_path: Path) -> None:
    server = make_server("127.0.0.1", 0, inspector=False)
    url = server.url
    server.server_close()  # nothing listens there any more

    status, report = evaluate(tmp_path, HOTEL / "scenario.json", "--url", url, judge=verdicts(1.0), script=None)

    assert status == 1
    first, second, *_ = turns_of(report)
    assert first["checks"][0]["name"] == "reply" and first["reason"].startswith("the turn failed: no answer")
    assert second["reason"] == "not run: an earlier turn of this run failed"
