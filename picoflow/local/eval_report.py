"""What ``picoflow eval`` reports: the table printed at the end, a JSON report and a JUnit XML report.

With several runs of a scenario each turn is summarised over them: how many runs it passed in, and the mean,
lowest, highest and standard deviation of its scores (real models answer differently from run to run).
"""

from __future__ import annotations

import statistics
import xml.etree.ElementTree as ET
from typing import Any

from picoflow.local.evaluation import ReportModel, ScenarioResult, TurnResult

_REASON_WIDTH = 72


class TurnSummary(ReportModel):
    """One turn of a scenario over all its runs."""

    index: int
    label: str
    runs: int
    passed: int
    pass_rate: float
    mean_score: float | None
    min_score: float | None
    max_score: float | None
    score_stdev: float | None
    mean_latency_ms: float | None
    mean_flow_tokens: float | None
    mean_judge_tokens: float | None
    reason: str

    @classmethod
    def of(cls, outcomes: list[TurnResult]) -> TurnSummary:
        """The summary of the same turn's ``outcomes``, one per run."""
        scores = [outcome.score for outcome in outcomes if outcome.score is not None]
        passed = sum(outcome.passed for outcome in outcomes)
        # The first failure explains the turn best; when every run passed, the last verdict does.
        failing = next((outcome for outcome in outcomes if not outcome.passed), None)
        reason = "; ".join(failing.failures()) if failing else outcomes[-1].reason
        return cls(
            index=outcomes[0].index,
            label=outcomes[0].label,
            runs=len(outcomes),
            passed=passed,
            pass_rate=round(passed / len(outcomes), 4),
            mean_score=_rounded(statistics.fmean(scores)) if scores else None,
            min_score=min(scores) if scores else None,
            max_score=max(scores) if scores else None,
            score_stdev=_rounded(statistics.pstdev(scores)) if len(scores) > 1 else None,
            mean_latency_ms=_mean([outcome.latency_ms for outcome in outcomes]),
            mean_flow_tokens=_mean([outcome.flow_tokens for outcome in outcomes]),
            mean_judge_tokens=_mean([outcome.judge_tokens for outcome in outcomes]),
            reason=reason,
        )


def summarise(result: ScenarioResult) -> list[TurnSummary]:
    """Each turn of ``result`` over its runs, in scenario order."""
    return [TurnSummary.of([run.turns[index] for run in result.runs]) for index in range(len(result.runs[0].turns))]


def render_table(results: list[ScenarioResult]) -> str:
    """The end-of-evaluation table of every scenario: turn, label, score, pass, reason, latency, tokens."""
    blocks = []
    for result in results:
        runs = len(result.runs)
        title = f"{result.flow_name} ({result.path}), judge {result.judge}" + (f", {runs} runs" if runs > 1 else "")
        rows = [["turn", "label", "score", "pass", "reason", "latency", "tokens"]]
        for summary in summarise(result):
            rows.append([
                str(summary.index), summary.label, _score_cell(summary),
                f"{summary.passed}/{summary.runs}" if runs > 1 else ("yes" if summary.passed else "NO"),
                _clip(summary.reason), _number(summary.mean_latency_ms, " ms"), _number(summary.mean_flow_tokens, ""),
            ])
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                 for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        failed = sum(not turn.passed for run in result.runs for turn in run.turns)
        total = sum(len(run.turns) for run in result.runs)
        verdict = "passed" if not failed else f"FAILED: {failed} of {total} turns"
        blocks.append("\n".join([title, *lines, verdict]))
    return "\n\n".join(blocks)


def json_report(results: list[ScenarioResult]) -> dict[str, Any]:
    """The whole evaluation as JSON: per scenario its summary per turn and every run with every check."""
    return {
        "passed": all(result.passed for result in results),
        "scenarios": [
            {
                "path": result.path,
                "flowName": result.flow_name,
                "judge": result.judge,
                "passed": result.passed,
                "summary": [summary.model_dump() for summary in summarise(result)],
                "runs": [run.model_dump() | {"passed": run.passed} for run in result.runs],
            }
            for result in results
        ],
    }


def junit_report(results: list[ScenarioResult]) -> str:
    """A JUnit XML document: a test suite per scenario file, a test case per turn of each run."""
    suites = ET.Element("testsuites", name="picoflow eval")
    all_tests = all_failures = 0
    all_time = 0.0
    for result in results:
        cases = [(run.run, turn) for run in result.runs for turn in run.turns]
        failures = sum(not turn.passed for _, turn in cases)
        seconds = sum(turn.latency_ms or 0 for _, turn in cases) / 1000
        suite = ET.SubElement(suites, "testsuite", name=f"{result.flow_name} ({result.path})", tests=str(len(cases)),
                              failures=str(failures), errors="0", skipped="0", time=f"{seconds:.3f}")
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="judge", value=result.judge)
        ET.SubElement(properties, "property", name="runs", value=str(len(result.runs)))
        for run, turn in cases:
            name = f"{turn.index:02d} {turn.label}" + (f" [run {run}]" if len(result.runs) > 1 else "")
            case = ET.SubElement(suite, "testcase", classname=f"{result.flow_name}.{_identifier(result.path)}",
                                 name=name, time=f"{(turn.latency_ms or 0) / 1000:.3f}")
            score = f"score {turn.score:.2f}, minimum {turn.min_score:.2f}" if turn.score is not None else "no score"
            if not turn.passed:
                failure = ET.SubElement(case, "failure", message="; ".join(turn.failures()) or "failed",
                                        type="ScenarioTurnFailure")
                failure.text = f"{score}\nreason: {turn.reason}"
            else:
                ET.SubElement(case, "system-out").text = f"{score}\nreason: {turn.reason}"
        all_tests, all_failures, all_time = all_tests + len(cases), all_failures + failures, all_time + seconds
    suites.set("tests", str(all_tests))
    suites.set("failures", str(all_failures))
    suites.set("errors", "0")
    suites.set("time", f"{all_time:.3f}")
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _score_cell(summary: TurnSummary) -> str:
    if summary.mean_score is None:
        return "-"
    if summary.runs == 1:
        return f"{summary.mean_score:.2f}"
    spread = f"{summary.min_score:.2f}-{summary.max_score:.2f}"
    return f"{summary.mean_score:.2f} ({spread}, sd {summary.score_stdev or 0:.2f})"


def _number(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _REASON_WIDTH else flat[: _REASON_WIDTH - 3] + "..."


def _mean(values: list[float | int | None]) -> float | None:
    present = [value for value in values if value is not None]
    return _rounded(statistics.fmean(present)) if present else None


def _rounded(value: float) -> float:
    return round(value, 4)


def _identifier(path: str) -> str:
    # JUnit readers split classname on dots into packages: the file becomes one dotless segment.
    return path.replace("\\", "/").replace(".", "_").replace("/", "_")
