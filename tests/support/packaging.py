"""Building the library's wheel and installing it into fresh virtual environments, as a user's project would.

``tests/conftest.py`` builds the wheel and one venv with it once per test session (its dependencies come from the
package registry); tests that install more on top use ``overlay_venv``, so that venv stays as the wheel left it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", ".pytest_cache")


def run(
    command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; a non-zero exit fails the test with the tail of its output."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def copy_into(dest: Path, names: list[str]) -> Path:
    """Copy the repository's files or directories ``names`` into ``dest``, without caches or build leftovers."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=CACHES)
        else:
            shutil.copy2(source, dest / name)
    return dest


def build_wheel(base: Path) -> Path:
    """The wheel built from a copy of the sources, handlers/ and flows/ included, as a checkout has them."""
    source = copy_into(base / "src", ["pyproject.toml", "README.md", "LICENSE", "picoflow", "handlers", "flows"])
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--quiet", "-w", str(base / "dist")])
    (built,) = (base / "dist").glob("*.whl")
    return built


def pip_install(python: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``pip install`` into the environment of ``python`` (which needs no pip of its own)."""
    return run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile", *arguments])


def make_venv(path: Path, *requirements: str) -> Path:
    """A fresh venv at ``path`` with ``requirements`` installed; returns its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    python = path / "bin" / "python"
    if requirements:
        pip_install(python, *requirements)
    return python


def overlay_venv(base_python: Path, path: Path) -> Path:
    """A venv at ``path`` that also sees every package of ``base_python``'s venv; returns its python.

    Whatever is installed into it lands in its own site-packages, which come first on ``sys.path``, so the
    base venv stays untouched and can be shared.
    """
    python = make_venv(path)
    # An import line of a .pth file runs at start-up; addsitedir also processes the base's own .pth files.
    line = f"import site; site.addsitedir({str(site_packages(base_python))!r})\n"
    (site_packages(python) / "_base_venv.pth").write_text(line)
    return python


def site_packages(python: Path) -> Path:
    """The site-packages directory of ``python``'s environment."""
    return Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())


def user_home(path: Path) -> Path:
    """A fresh home directory at ``path`` holding this machine's pip configuration, so pip uses the same index.

    ``pip config list`` gives the settings in force; those of ``PIP_*`` variables (``:env:``) are left to the
    caller, who passes the variables themselves.
    """
    sections: dict[str, dict[str, str]] = {}
    for line in run([sys.executable, "-m", "pip", "config", "list"]).stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section and not section.startswith(":"):
            sections.setdefault(section, {})[name] = ast.literal_eval(value)
    config = path / ".config" / "pip" / "pip.conf"
    config.parent.mkdir(parents=True)
    config.write_text("".join(
        f"[{section}]\n" + "".join(f"{name} = {value}\n" for name, value in values.items())
        for section, values in sections.items()
    ))
    return path
