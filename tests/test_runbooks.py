"""Every alarm of template.yaml has its runbook, and the dashboard has the widgets the runbooks send an operator to.

The runbooks page (docs/operating/runbooks.md) has a ``## <logical id>`` section per alarm, each with what the
alarm means, how to confirm it (a Logs Insights query naming its log group, a dashboard widget), what to do and how
to verify; each widget it names is one of the dashboard's, and each log group a query names is one of the stack's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "docs" / "operating" / "runbooks.md"
PARTS = ("**What it means.**", "**Confirm.**", "**What to do.**", "**Verify.**")


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return cfn_yaml.load(str(ROOT / "template.yaml"))


def sections() -> dict[str, str]:
    text = RUNBOOKS.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for block in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title, _, body = block.partition("\n")
        found[title.strip()] = body
    return found


def alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}


def dashboard(template: dict[str, Any]) -> dict[str, Any]:
    body, variables = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    assert set(variables) == {"SessionsTableInUse", "WebSocketFunctionName", "WebSocketApiId"}
    # Every ${...} is a string inside the JSON: any text in its place gives the same structure.
    parsed: dict[str, Any] = json.loads(re.sub(r"\$\{[^}]+\}", "X", body))
    return parsed


def widget_titles(template: dict[str, Any]) -> set[str]:
    return {widget["properties"]["title"] for widget in dashboard(template)["widgets"]}


def test_every_alarm_has_a_runbook_section_and_nothing_else_does(template: dict[str, Any]) -> None:
    assert set(sections()) == set(alarms(template))
    assert len(alarms(template)) == 15


@pytest.mark.parametrize("name", sorted(sections()))
def test_each_runbook_says_what_it_means_how_to_confirm_what_to_do_and_verify(
    template: dict[str, Any], name: str
) -> None:
    body = sections()[name]
    positions = [body.find(part) for part in PARTS]
    assert all(position >= 0 for position in positions) and positions == sorted(positions), name
    queries = re.findall(r"```text\n(.*?)```", body, flags=re.DOTALL)
    assert queries, f"{name} has no Logs Insights query"
    log_groups = {n for n, r in template["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup"}
    for query in queries:
        first = query.splitlines()[0]
        assert first.startswith("# ") and first[2:].split()[0] in log_groups, (name, first)
        assert re.search(r"^(filter|fields|stats)", query, flags=re.MULTILINE), (name, query)
    widgets = set(re.findall(r"widgets? \*([^*]+)\*", body))
    widgets |= {w for pair in re.findall(r"\*([^*]+)\* and \*([^*]+)\*", body) for w in pair}
    assert widgets, f"{name} names no dashboard widget"
    assert widgets <= widget_titles(template), (name, widgets - widget_titles(template))


def test_the_alarm_descriptions_and_the_runbooks_name_the_same_alarms(template: dict[str, Any]) -> None:
    # The production page's alarm table lists each alarm too, and points at the runbooks.
    production = (ROOT / "docs" / "operating" / "production.md").read_text(encoding="utf-8")
    assert "(runbooks.md)" in production
    for name in alarms(template):
        assert f"`{name}`" in production, name


def test_the_dashboard_covers_what_an_operator_watches(template: dict[str, Any]) -> None:
    assert widget_titles(template) >= {
        "Turns by flow", "Turn latency", "Failures by code", "Tokens and cache reads", "Failed turns and conflicts",
        "Sessions table capacity", "Sessions table throttles and errors", "Concurrency and throttles",
        "API responses", "Function errors",
    }
    body = json.dumps(dashboard(template))
    for metric in ("CachedInputTokens", "SessionConflicts", "ConsumedWriteCapacityUnits", "ConcurrentExecutions"):
        assert metric in body, metric


def test_the_5xx_alarm_fires_at_any_traffic(template: dict[str, Any]) -> None:
    alarm = template["Resources"]["ApiServerErrorRateAlarm"]["Properties"]
    (expression,) = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    # Evaluate the expression's arithmetic: one 5xx among 3 requests, and 1 among 1,000.
    def rate(errors: int, requests: int) -> float:
        return 100 * errors / (20 if requests < 20 else requests)

    assert expression == "100 * errors / IF(requests < 20, 20, requests)"
    assert rate(1, 3) >= alarm["Threshold"] and rate(1, 1000) < alarm["Threshold"]


def test_the_spend_and_failure_alarms_take_their_thresholds_from_parameters(template: dict[str, Any]) -> None:
    expected = {
        "FailedTurnsAlarm": ("FailedTurnsThreshold", "TurnFailures"),
        "InputTokensAlarm": ("InputTokensPerHourThreshold", "InputTokens"),
        "OutputTokensAlarm": ("OutputTokensPerHourThreshold", "OutputTokens"),
    }
    for name, (parameter, metric) in expected.items():
        props = template["Resources"][name]["Properties"]
        assert props["Threshold"] == {"Ref": parameter}
        (query,) = props["Metrics"]
        assert query["Expression"] == f"SELECT SUM({metric}) FROM PicoFlow"
    throttled = template["Resources"]["ApiThrottledRequestsAlarm"]["Properties"]
    assert throttled["Threshold"] == {"Ref": "ThrottledRequestsThreshold"}
    metric_filter = template["Resources"]["ApiThrottledRequestsMetric"]["Properties"]
    assert metric_filter["LogGroupName"] == {"Ref": "ApiAccessLogs"}
    assert metric_filter["FilterPattern"] == '{ $.status = "429" }'
    (transformation,) = metric_filter["MetricTransformations"]
    assert (transformation["MetricNamespace"], transformation["MetricName"]) == (
        throttled["Namespace"], throttled["MetricName"]
    )


def test_the_websocket_path_is_alarmed_like_the_http_path(template: dict[str, Any]) -> None:
    every = alarms(template)
    for http, websocket in (
        ("FunctionErrorsAlarm", "WebSocketFunctionErrorsAlarm"),
        ("FunctionThrottlesAlarm", "WebSocketFunctionThrottlesAlarm"),
        ("FunctionDurationAlarm", "WebSocketFunctionDurationAlarm"),
    ):
        assert every[websocket]["Condition"] == "HasWebSocketApi"
        as_http = json.dumps(every[websocket]["Properties"]).replace("WebSocketFunction", "ApiFunction")
        as_http = as_http.replace("WebSocketTimeout", "Timeout")
        assert json.loads(as_http)["Metrics" if "Metrics" in every[http]["Properties"] else "MetricName"] == (
            every[http]["Properties"]["Metrics" if "Metrics" in every[http]["Properties"] else "MetricName"]
        )
    assert every["WebSocketApiErrorsAlarm"]["Condition"] == "HasWebSocketApi"
