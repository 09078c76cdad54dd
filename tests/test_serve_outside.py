"""``picoflow serve`` in a folder of one's own: PicoFlow's handler by default, state kept out of the folder, and a
module that cannot be found reported in one sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from picoflow.local import cli
from picoflow.local.project import DEFAULT_HANDLER, ProjectError, check_flow_modules, load_handler
from picoflow.local.serve import state_folder


@pytest.fixture
def own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    # This test run imported the repository's handlers package; a folder of one's own has none.
    for name in [name for name in sys.modules if name == "handlers" or name.startswith("handlers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if Path(entry or ".").resolve() != Path.cwd()
                                      and not (Path(entry or ".") / "handlers").is_dir()])
    return tmp_path


def test_without_a_handlers_package_the_default_handler_is_picoflows_own(own_folder: Path) -> None:
    from picoflow.aws.api import lambda_handler

    assert load_handler(DEFAULT_HANDLER) is lambda_handler


def test_a_named_handler_that_cannot_be_imported_is_one_sentence(own_folder: Path) -> None:
    with pytest.raises(ProjectError, match=r"^Cannot import the handler module 'nothere': no module named 'nothere'"):
        load_handler("nothere:handler")
    (own_folder / "mine.py").write_text("value = 1\n")
    with pytest.raises(ProjectError, match=r"^The module 'mine' has no callable 'handler'"):
        load_handler("mine:handler")


def test_a_missing_flow_module_is_one_sentence_but_a_broken_one_keeps_its_error(own_folder: Path) -> None:
    (own_folder / "greeting.py").write_text("GREETING = 1\n")
    check_flow_modules("greeting")
    with pytest.raises(ProjectError, match=r"^No flow module 'greetings': there is no greetings.py or "):
        check_flow_modules("greeting, greetings")
    (own_folder / "broken.py").write_text("import not_installed_anywhere\n")
    with pytest.raises(ModuleNotFoundError, match="not_installed_anywhere"):
        check_flow_modules("broken")


def test_the_command_prints_the_sentence_and_exits_2(own_folder: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(own_folder.parent / "state"))
    # serve() sets these for the process: set here first, they are restored after the test.
    for name, value in (("SESSION_STORE", "MEMORY"), ("PICOFLOW_FLOWS", ""), ("FILES_FOLDER", str(own_folder.parent))):
        monkeypatch.setenv(name, value)
    assert cli.main(["serve", "--flows", "greetings", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("picoflow serve: error: No flow module 'greetings'") and err.count("\n") == 1
    assert "Traceback" not in err and list(own_folder.iterdir()) == []


def test_sessions_and_uploads_live_in_the_users_state_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_folder() == tmp_path / "xdg" / "picoflow"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_folder() == tmp_path / "home" / ".local" / "state" / "picoflow"
