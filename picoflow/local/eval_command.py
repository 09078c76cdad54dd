"""``picoflow eval SCENARIO.json [...]``: run scenario files against the project's flows and judge every turn.

In process by default: each turn is the API Gateway event of ``POST /ai/run`` given to the project's Lambda
handler (``--handler``, ``--flows`` as for ``picoflow serve``); ``--url`` sends the turns to a served or deployed
API instead. Every run is a new session. Exit status 0 when every turn of every run passed, 1 when one failed,
2 when the evaluation could not start (a malformed scenario, a judge without a key, ...).

Offline, nothing leaves the machine: the flow's model is scripted (``--script`` or ``PICOFLOW_SCRIPT``) and so is
the judge (``--judge-script PATH``, or else the flow script's replies marked ``"for": "judge"``), unless ``--judge``
names a real model, which then judges the scripted flow. With
``--repeat N`` each script is served as if it were written N times over, so a script of one run's replies
answers every run, and scripted runs go one at a time, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picoflow.aws.discovery import FLOWS_VARIABLE
from picoflow.errors import PicoFlowError
from picoflow.local.eval_report import json_report, junit_report, render_table
from picoflow.local.evaluation import HttpTarget, InProcessTarget, Job, Target, run_jobs
from picoflow.local.judge import SCRIPTED, Judge, judge_selection, read_prompt
from picoflow.local.project import DEFAULT_HANDLER, load_handler
from picoflow.local.scenario import DEFAULT_JUDGE_MODEL, Scenario, ScenarioError, load_scenario
from picoflow.models.factory import default_registry
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider

DESCRIPTION = (
    "Run scenario files (flowName, judgeModel, judgeMinScore, turns of input / expectedResponse / completed / "
    "minScore) against the project's flows, one new session per run, and judge every reply with a model. "
    "Exit status 1 when a turn fails."
)
SCRIPT_VARIABLE = "PICOFLOW_SCRIPT"
DEFAULT_CONCURRENCY = 4


class EvalSetupError(Exception):
    """The evaluation cannot start; the message says why."""


@dataclass(frozen=True)
class _Plan:
    target: Target
    jobs: list[Job]
    scripted: bool
    #: The in-process handler's copy of the flow script, removed at the end.
    script_copy: Path | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``picoflow eval``."""
    parser.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="scenario JSON files")
    parser.add_argument("--url", help="base URL of a served or deployed API (default: the handler, in process)")
    parser.add_argument(
        "--judge", metavar="PROVIDER:MODEL",
        help="the judge model, e.g. openai:gpt-4o-mini or anthropic:claude-sonnet-4-5; 'scripted' replays "
        "--judge-script (default: each file's judgeModel, an OpenAI model unless it names a provider)",
    )
    parser.add_argument("--judge-script", metavar="PATH", help="JSON list of scripted judge replies")
    parser.add_argument("--judge-prompt", metavar="PATH", help="the judge's instructions (default: the bundled ones)")
    parser.add_argument(
        "--script", metavar="PATH",
        help="scripted replies for the flow's model, in process: a JSON list, or a conversation.json "
        "(default: $PICOFLOW_SCRIPT)",
    )
    parser.add_argument("--repeat", type=_positive, default=1, metavar="N", help="runs of each scenario (default: 1)")
    parser.add_argument(
        "--concurrency", type=_positive, default=DEFAULT_CONCURRENCY, metavar="N",
        help="runs at a time (default: %(default)s; scripted runs go one at a time)",
    )
    parser.add_argument("--json", dest="json_path", metavar="PATH", help="write a JSON report here")
    parser.add_argument("--junit", dest="junit_path", metavar="PATH", help="write a JUnit XML report here")
    parser.add_argument("--flows", metavar="MODULES", help="comma-separated modules whose flows to register")
    parser.add_argument(
        "--handler", default=DEFAULT_HANDLER, metavar="MODULE:ATTR", help="the Lambda handler (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the evaluation ``args`` describe; returns the exit status."""
    try:
        plan = _prepare(args)
    except (EvalSetupError, ScenarioError, PicoFlowError) as error:
        print(f"picoflow eval: {error}", file=sys.stderr)
        return 2
    concurrency = 1 if plan.scripted else args.concurrency
    if plan.scripted and args.concurrency > 1 and len(plan.jobs) > 1:
        print("Scripted models answer in script order: the runs go one at a time.", flush=True)
    try:
        results = asyncio.run(run_jobs(plan.jobs, plan.target, concurrency=concurrency, progress=_print_progress))
    finally:
        if plan.script_copy is not None:
            plan.script_copy.unlink(missing_ok=True)
    print("\n" + render_table(results), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(json_report(results), indent=2, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    if args.junit_path:
        Path(args.junit_path).write_text(junit_report(results), encoding="utf-8")
    return 0 if all(result.passed for result in results) else 1


def _prepare(args: argparse.Namespace) -> _Plan:
    scenarios = [(path, load_scenario(path)) for path in args.scenarios]
    flow_script = args.script or os.environ.get(SCRIPT_VARIABLE) or None
    if args.url and args.script:
        raise EvalSetupError(f"--script scripts the in-process handler; start the server with {SCRIPT_VARIABLE}.")
    # A scripted flow gets a scripted judge unless --judge names a real model: then that model judges it.
    real_judge = bool(args.judge) and args.judge.partition(":")[0] != SCRIPTED
    judge_script = args.judge_script or (None if real_judge else flow_script)
    if args.judge and not real_judge and not judge_script:
        raise EvalSetupError(f"--judge scripted needs --judge-script PATH or {SCRIPT_VARIABLE}.")
    registry = _judge_registry(judge_script, args.repeat)
    prompt = read_prompt(args.judge_prompt)
    judges: dict[str, Judge] = {}
    for _, scenario in scenarios:
        spec = _judge_spec(args.judge, scenario)
        if spec not in judges:
            judges[spec] = Judge(registry, judge_selection(spec, registry), prompt)
    script_copy = None
    if args.url:
        target: Target = HttpTarget(args.url)
    else:
        target, script_copy = _in_process_target(args, flow_script)
    # Run by run, each file in turn: the order a script written for several files and runs is consumed in.
    jobs = [
        Job(path=path, scenario=scenario, judge=judges[_judge_spec(args.judge, scenario)], run=run, runs=args.repeat)
        for run in range(1, args.repeat + 1)
        for path, scenario in scenarios
    ]
    return _Plan(target, jobs, bool(judge_script) or script_copy is not None, script_copy)


def _judge_spec(option: str | None, scenario: Scenario) -> str:
    return option or scenario.judge_model or DEFAULT_JUDGE_MODEL


def _judge_registry(script: str | None, repeat: int) -> ProviderRegistry:
    """Every provider, configured from the environment; a script, when there is one, answers every judge call."""
    registry = default_registry({name: value for name, value in os.environ.items() if name != SCRIPT_VARIABLE})
    if script:
        registry.override = ScriptedProvider(script_replies(script) * repeat, name=SCRIPTED)
    return registry


def _in_process_target(args: argparse.Namespace, flow_script: str | None) -> tuple[InProcessTarget, Path | None]:
    # The handler's engine is built from the environment on its first turn: configure it before that.
    if args.flows:
        os.environ[FLOWS_VARIABLE] = args.flows
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    copy = None
    if flow_script:
        replies = script_replies(flow_script) * args.repeat
        handle, name = tempfile.mkstemp(prefix="picoflow-eval-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(replies, file)
        copy = Path(name)
        os.environ[SCRIPT_VARIABLE] = name
    try:
        return InProcessTarget(load_handler(args.handler)), copy
    except (ImportError, AttributeError, ValueError) as error:
        raise EvalSetupError(f"Cannot load the handler {args.handler}: {error}") from error


def script_replies(path: str | Path) -> list[Any]:
    """The scripted replies in the file at ``path``: a JSON list of replies, or a conversation (``{"turns":
    [{"user", "replies"}]}``, a flow package's ``conversation.json``) whose replies are taken in turn order."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise EvalSetupError(f"Cannot read the script {path}: {error}") from error
    if isinstance(data, dict) and isinstance(data.get("turns"), list):
        return [reply for turn in data["turns"] for reply in turn.get("replies") or []]
    if isinstance(data, list):
        return data
    raise EvalSetupError(f"The script {path} must be a JSON list of replies or a conversation with turns.")


def _print_progress(line: str) -> None:
    print(line, flush=True)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 up, not {text!r}")
    return value
