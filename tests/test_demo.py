"""``make run``: every bundled conversation replays to completion through the local server and handler."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from picoflow.local.demo import find_conversation, load_conversation

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "flow", ["BasicFlow", "HotelFlow", "HomeInsuranceQuoteFlow", "InvoiceFlow", "RefundFlow", "SupportFlow"]
)
def test_demo_replays_the_bundled_conversation_to_completion(flow, tmp_path):
    conversation, replies = load_conversation(find_conversation(flow))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "picoflow.local.demo", "--flow", flow],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert out.count("\nuser > ") == len(conversation["turns"])
    assert "runStatus=completed" in out
    assert "error " not in out
    assert replies  # the script is not empty, so every reply above came from it
    # Only the transcript and its summary: no metrics line (Powertools prints EMF as JSON), no warnings.
    assert '"_aws"' not in out + result.stderr
    assert "Warning" not in result.stderr


def test_the_demo_needs_only_the_librarys_own_dependencies(venv_python, tmp_path):
    # venv_python holds the library's wheel and its dependencies, no extra: what `make run` installs.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [str(venv_python), "-m", "picoflow.local.demo", "--flow", "HotelFlow"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "runStatus=completed" in result.stdout


def test_make_run_installs_the_library_alone_and_make_test_the_development_extras():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")

    def recipe(target: str) -> str:
        return re.search(rf"^{re.escape(target)}: pyproject.toml\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)

    run_stamp = re.search(r"^run: (\S+)$", makefile, re.MULTILINE).group(1)
    assert run_stamp != "$(STAMP)"
    assert "pip install -e ." in recipe(run_stamp) and "[dev]" not in recipe(run_stamp)
    # Progress shows: the first install takes a while.
    assert "--quiet" not in recipe(run_stamp)
    # make test (through lint) keeps the full development install.
    assert re.search(r"^lint: \$\(STAMP\)$", makefile, re.MULTILINE)
    assert "-e '.[dev,docs]'" in recipe("$(STAMP)")


def test_unknown_flow_names_the_bundled_ones():
    with pytest.raises(SystemExit, match="Bundled: .*BasicFlow"):
        find_conversation("NoSuchFlow")
