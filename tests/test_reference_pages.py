"""The troubleshooting and configuration pages cover what the code has: every error code, every setting it reads,
every template parameter with its default."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from picoflow import Flow, FlowEngine, ModelSelection, Step
from picoflow.errors import PUBLIC_MESSAGES, ScriptExhaustedError
from picoflow.models.openai import OPENAI_COMPATIBLE
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.stores import MemorySessionStore

ROOT = Path(__file__).resolve().parents[1]
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
CONFIGURATION = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")

# Set by Lambda or the SDK's own credential chain, not by whoever configures PicoFlow.
_PLATFORM = {"AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_TIMEOUT", "AWS_SAM_LOCAL",
             "AWS_LAMBDA_INITIALIZATION_TYPE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
_READS = [
    re.compile(r"""(?:environ|env)(?:\.get)?\(\s*["']([A-Z][A-Z0-9_]+)["']"""),
    re.compile(r"""environ\[\s*["']([A-Z][A-Z0-9_]+)["']\s*\]"""),
    re.compile(r"""getenv\(\s*["']([A-Z][A-Z0-9_]+)["']"""),
    re.compile(r"""^[A-Z_]*VARIABLE\s*=\s*["']([A-Z][A-Z0-9_]+)["']""", re.MULTILINE),
    # The file policy's mapping of its fields to their variables.
    re.compile(r""":\s*["'](PICOFLOW_[A-Z0-9_]+)["']"""),
]


def variables_read_by_the_library() -> set[str]:
    found: set[str] = set()
    for source in (ROOT / "picoflow").rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        for pattern in _READS:
            found.update(pattern.findall(text))
    return found - _PLATFORM


def test_every_error_code_has_a_cause_and_a_fix_on_the_troubleshooting_page() -> None:
    headings = re.findall(r"^### (.+)$", TROUBLESHOOTING, re.MULTILINE)
    listed = {code.strip() for heading in headings for code in heading.split(",")}
    assert set(PUBLIC_MESSAGES) <= listed, sorted(set(PUBLIC_MESSAGES) - listed)
    for section in re.split(r"^### ", TROUBLESHOOTING, flags=re.MULTILINE)[1:]:
        assert "**Cause:**" in section and "**Fix:**" in section, section.splitlines()[0]


def test_every_setting_the_library_reads_is_on_the_configuration_page() -> None:
    # The OpenAI-compatible providers name their variables in a table rather than reading them by literal.
    endpoints = {name for endpoint in OPENAI_COMPATIBLE.values()
                 for name in (endpoint.key_env, endpoint.base_url_env, endpoint.api_version_env) if name}
    variables = variables_read_by_the_library() | endpoints
    # The scan finds the settings (a broken pattern would find none and pass).
    assert {"SESSION_STORE", "PICOFLOW_SCRIPT", "PICOFLOW_FLOWS", "PICOFLOW_MAX_FILE_BYTES", "SQLITE_PATH"} <= variables
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", CONFIGURATION))
    assert variables <= documented, sorted(variables - documented)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "_generated" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_template_parameters_table_the_page_includes_is_the_templates_with_each_default() -> None:
    generate = _generator()
    assert '--8<-- "docs/_generated/template-parameters.md"' in CONFIGURATION.splitlines()
    committed = generate.TEMPLATE_PARAMETERS.read_text(encoding="utf-8")
    # The committed copy is what the template gives today: after a change to template.yaml, run
    # `python docs/_generated/generate.py` (make docs does) and commit the result.
    assert committed == generate.parameters_table(), "docs/_generated/template-parameters.md is stale"
    assert generate.main(["--check"]) == 0
    text = (ROOT / "template.yaml").read_text(encoding="utf-8")
    parameters = yaml.load(text, Loader=generate.TemplateLoader)["Parameters"]
    assert len(parameters) > 10
    for name, parameter in parameters.items():
        default = parameter.get("Default")
        shown = "(empty)" if default in ("", None) else f"`{default}`"
        assert re.search(rf"^\| `{name}` \| {re.escape(shown)} \|", committed, re.MULTILINE), name


def test_a_changed_template_gives_a_different_table(tmp_path: Path) -> None:
    generate = _generator()
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    assert "Default: 604800" in template
    changed = tmp_path / "template.yaml"
    changed.write_text(template.replace("Default: 604800", "Default: 86400", 1), encoding="utf-8")
    table = generate.parameters_table(changed)
    assert table != generate.parameters_table()
    assert "| `SessionRetentionSeconds` | `86400` |" in table


def test_a_script_out_of_replies_names_itself_and_the_setting_to_fix() -> None:
    model = ScriptedProvider([{"content": "only one"}]).chat_model(ModelSelection(provider="openai", name="m"))
    model.invoke("first")
    try:
        model.invoke("second")
    except ScriptExhaustedError as error:
        assert error.code == "MODEL_UNAVAILABLE" and "has no reply for model call 2" in str(error)
    else:
        raise AssertionError("the second call found a reply")
    assert "`PICOFLOW_SCRIPT`" in CONFIGURATION and "PICOFLOW_SCRIPT" in TROUBLESHOOTING


def test_the_hotel_flows_line_count_on_the_run_locally_page_is_measured() -> None:
    page = (ROOT / "docs" / "get-started" / "run-locally.md").read_text(encoding="utf-8")
    (shown,) = re.findall(r"are \*\*(\d+) lines\*\*", page)
    counted = sum(len((ROOT / "flows" / "hotel" / name).read_text(encoding="utf-8").splitlines())
                  for name in ("flow.py", "steps.py"))
    assert int(shown) == counted


class OneStep(Step):
    def get_prompt(self) -> str:
        return "Greet the user."


class OneStepFlow(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini", retry_attempts=1)

    def define_steps(self) -> list[Step]:
        return [OneStep(self)]


async def test_the_turn_log_names_the_exhausted_script_and_the_call(caplog: pytest.LogCaptureFixture) -> None:
    engine = FlowEngine([OneStepFlow], MemorySessionStore(), providers=ProviderRegistry(override=ScriptedProvider([])))
    with caplog.at_level(logging.INFO, logger="picoflow"):
        response = await engine.run("OneStepFlow", "Hi")
    assert response.error_code == "MODEL_UNAVAILABLE"
    (failed,) = [record for record in caplog.records if record.getMessage() == "Turn failed"]
    assert failed.setting == "PICOFLOW_SCRIPT"  # type: ignore[attr-defined]
    assert "has no reply for model call 1, a chat call of step 'OneStep'" in failed.detail  # type: ignore[attr-defined]
