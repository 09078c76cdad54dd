"""Packaging: the wheel is the ``picoflow`` library alone; installed, it registers a project's own flows and
the flow packages named by ``picoflow.flows`` entry points; the function's build ships only the application.

The wheel and the venv holding it come from ``tests/conftest.py`` (built once per session and shared with
``tests/test_scaffold.py``); they and the function build install from the package registry (about two minutes
in all).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

import picoflow
from picoflow.aws import discovery
from picoflow.aws import runtime as aws_runtime
from tests.support.packaging import ROOT, copy_into, run

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DISTRIBUTION = PYPROJECT["project"]["name"]
BUNDLED_FLOWS = [
    "BasicFlow", "HomeInsuranceQuoteFlow", "HotelFlow", "InvoiceFlow", "RefundFlow", "SupportFlow",
]
# Lambda's limit on a function's unzipped code.
LAMBDA_UNZIPPED_LIMIT = 262_144_000
# The function's measured size (70.8 MB unzipped, 20.9 MB zipped) plus about a tenth.
FUNCTION_UNZIPPED_BUDGET = 78_000_000
FUNCTION_ZIPPED_BUDGET = 23_000_000

FLOW_MODULE = '''
from picoflow import Flow, ModelSelection, Step


class {name}Step(Step):
    def get_prompt(self) -> str:
        return "Greet the user."


class {name}(Flow):
    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="openai", name="gpt-4o-mini")

    def define_steps(self) -> list[Step]:
        return [{name}Step(self)]
'''


def files_under(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


# -- the wheel -------------------------------------------------------------------------------------


def test_the_wheel_holds_the_picoflow_package_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"picoflow"}
    assert wheel.name.startswith(f"{DISTRIBUTION.replace('-', '_')}-")


def test_the_wheel_passes_the_release_workflows_twine_check(wheel: Path) -> None:
    # .github/workflows/release.yml runs the same check before publishing: metadata and the README's rendering.
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_ships_the_type_marker_package_data_and_license(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    assert "picoflow/py.typed" in names
    data = {f"picoflow/{name}" for name in files_under(ROOT / "picoflow") if not name.endswith(".py")}
    assert "picoflow/local/static/index.html" in data
    assert data <= names, sorted(data - names)

    (metadata_path,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    metadata = Parser().parsestr(archive.read(metadata_path).decode())
    assert metadata["Name"] == DISTRIBUTION
    assert metadata["Version"] == PYPROJECT["project"]["version"]
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE"
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    dist_info = metadata_path.rsplit("/", 1)[0]
    assert "PicoFlow for Python contributors" in archive.read(f"{dist_info}/licenses/LICENSE").decode()
    assert "picoflow = picoflow.local.cli:main" in archive.read(f"{dist_info}/entry_points.txt").decode()


def test_version_comes_from_the_installed_distribution_or_the_source_tree() -> None:
    assert picoflow.__version__ == PYPROJECT["project"]["version"]
    # Not installed (a bare source tree on the path): the constant, which must match pyproject.toml.
    code = (
        "import importlib.metadata as metadata\n"
        "def missing(name):\n"
        "    raise metadata.PackageNotFoundError(name)\n"
        "metadata.version = missing\n"
        "import picoflow\n"
        "print(picoflow.__version__)\n"
    )
    result = run([sys.executable, "-c", code], cwd=ROOT)
    assert result.stdout.strip() == PYPROJECT["project"]["version"]


# -- installed next to a project of one's own --------------------------------------------------------


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``own``: a project with its own flows/ package and the example handler; ``bare``: the handler alone."""
    base = tmp_path_factory.mktemp("projects")
    made = {}
    for name in ("own", "bare"):
        handlers = base / name / "handlers"
        handlers.mkdir(parents=True)
        (handlers / "__init__.py").write_text("")
        shutil.copy2(ROOT / "handlers" / "api.py", handlers / "api.py")
        made[name] = base / name
    (made["own"] / "flows").mkdir()
    (made["own"] / "flows" / "__init__.py").write_text(FLOW_MODULE.format(name="GreetingFlow"))
    return made


@pytest.fixture(scope="module")
def flow_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A flow package declaring a ``picoflow.flows`` entry point, pip-installed into a directory of its own."""
    base = tmp_path_factory.mktemp("acme")
    source = base / "acme-flows"
    (source / "acme_flows").mkdir(parents=True)
    (source / "acme_flows" / "__init__.py").write_text(FLOW_MODULE.format(name="AcmeFlow"))
    (source / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools>=77"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        'name = "acme-flows"\n'
        'version = "1.0"\n'
        f'dependencies = ["{DISTRIBUTION}"]\n\n'
        '[project.entry-points."picoflow.flows"]\n'
        'acme = "acme_flows"\n\n'
        "[tool.setuptools]\n"
        'packages = ["acme_flows"]\n'
    )
    target = base / "site"
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)])
    return target


def flow_names(python: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the project's handler in ``cwd`` as Lambda would (the project on the path) and list its flows."""
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "PYTHONNOUSERSITE": "1",
        "SESSION_STORE": "MEMORY",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_TRACE_DISABLED": "true",
        **env,
    }
    code = (
        "import json\n"
        "import handlers.api\n"
        "from picoflow.aws.runtime import build_engine\n"
        "print(json.dumps(sorted(build_engine().get_flow_names())))\n"
    )
    return subprocess.run([str(python), "-c", code], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)


def registered(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_installed_wheel_registers_only_the_projects_own_flows(venv_python: Path, projects: dict[str, Path]) -> None:
    # The venv has picoflow and no top-level handlers or flows package of ours.
    probe = (
        "import importlib.util, picoflow\n"
        "print(picoflow.__file__, importlib.util.find_spec('flows'), importlib.util.find_spec('handlers'))\n"
    )
    result = run([str(venv_python), "-c", probe], cwd=projects["bare"].parent)
    location, flows_spec, handlers_spec = result.stdout.split()
    assert Path(location).is_relative_to(venv_python.parent.parent)
    assert (flows_spec, handlers_spec) == ("None", "None")

    assert registered(flow_names(venv_python, projects["own"])) == ["GreetingFlow"]


def test_installed_flow_packages_register_through_entry_points(
    venv_python: Path, projects: dict[str, Path], flow_package: Path
) -> None:
    with_package = {"PYTHONPATH": str(flow_package)}
    assert registered(flow_names(venv_python, projects["bare"], **with_package)) == ["AcmeFlow"]
    # Unset, PICOFLOW_FLOWS means the installed flow packages plus the project's own flows/.
    assert registered(flow_names(venv_python, projects["own"], **with_package)) == ["AcmeFlow", "GreetingFlow"]
    # Set, it names exactly the modules to load.
    only = flow_names(venv_python, projects["own"], PICOFLOW_FLOWS="acme_flows", **with_package)
    assert registered(only) == ["AcmeFlow"]
    # No flow package and no flows/: nothing to serve, and the start-up says so.
    missing = flow_names(venv_python, projects["bare"])
    assert missing.returncode != 0
    assert "No module named 'flows'" in missing.stderr


# -- discovery in this repository ------------------------------------------------------------------------


@pytest.fixture
def entry_point_flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution whose ``picoflow.flows`` entry point names the module ``pf_entry_flows``."""
    module = "pf_entry_flows"
    (tmp_path / f"{module}.py").write_text(FLOW_MODULE.format(name="EntryFlow"))
    dist_info = tmp_path / "pf_entry_flows-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: pf-entry-flows\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[picoflow.flows]\nentry = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    sys.modules.pop(module, None)
    importlib.invalidate_caches()


def names(flows: list[type]) -> list[str]:
    return sorted(flow.__name__ for flow in flows)


def test_unset_flows_are_the_bundled_examples_without_entry_points() -> None:
    assert names(discovery.load_flows(None)) == BUNDLED_FLOWS
    assert names(discovery.load_flows(discovery.DEFAULT_FLOW_MODULES)) == BUNDLED_FLOWS


def test_entry_point_flows_join_the_bundled_ones_by_default(entry_point_flows: str) -> None:
    assert names(discovery.load_flows(None)) == sorted([*BUNDLED_FLOWS, "EntryFlow"])
    assert names(discovery.load_flows(discovery.DEFAULT_FLOW_MODULES)) == sorted([*BUNDLED_FLOWS, "EntryFlow"])
    engine = aws_runtime.build_engine({"SESSION_STORE": "MEMORY"})
    assert sorted(engine.get_flow_names()) == sorted([*BUNDLED_FLOWS, "EntryFlow"])


def test_picoflow_flows_names_exactly_the_modules_loaded(entry_point_flows: str) -> None:
    assert names(discovery.load_flows("flows.basic")) == ["BasicFlow"]
    assert names(discovery.load_flows(f" {entry_point_flows} ,")) == ["EntryFlow"]
    engine = aws_runtime.build_engine({"SESSION_STORE": "MEMORY", "PICOFLOW_FLOWS": "flows.hotel"})
    assert engine.get_flow_names() == ["HotelFlow"]


# -- the function's build ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template_function() -> tuple[str, dict]:
    template = cfn_yaml.load(str(ROOT / "template.yaml"))
    return "ApiFunction", template["Resources"]["ApiFunction"]


def makefile_variable(name: str) -> str:
    match = re.search(rf"^{name} \?= (.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert match, name
    return match.group(1).strip()


def test_sam_builds_the_function_with_the_makefiles_target(template_function: tuple[str, dict]) -> None:
    logical_id, resource = template_function
    assert resource["Metadata"]["BuildMethod"] == "makefile"
    assert resource["Properties"]["CodeUri"] == "."
    assert re.search(rf"^build-{logical_id}:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    # The wheels it installs are for the function's runtime and architecture.
    runtime = resource["Properties"]["Runtime"]
    assert runtime == f"python{makefile_variable('LAMBDA_PYTHON')}"
    (architecture,) = resource["Properties"]["Architectures"]
    machine = {"arm64": "aarch64", "x86_64": "x86_64"}[architecture]
    assert all(platform.endswith(f"_{machine}") for platform in makefile_variable("LAMBDA_PLATFORMS").split())


@pytest.fixture(scope="module")
def artifact(template_function: tuple[str, dict], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``sam build`` gets from the build target, run in a copy of the repository as sam does."""
    base = tmp_path_factory.mktemp("function")
    checkout = copy_into(
        base / "checkout",
        ["Makefile", "requirements.txt", "pyproject.toml", "README.md", "LICENSE", "template.yaml", "samconfig.toml",
         "picoflow", "handlers", "flows", "tests", "benchmarks", "events"],
    )
    for leftover in ("build/lib/handlers/stale.py", ".cache/leftover.txt", "flows/__pycache__/stale.pyc"):
        (checkout / leftover).parent.mkdir(parents=True, exist_ok=True)
        (checkout / leftover).write_text("left over by an earlier run")
    logical_id, _ = template_function
    out = base / "artifact"
    out.mkdir()
    env = {**os.environ, "ARTIFACTS_DIR": str(out)}
    run(["make", "--no-print-directory", f"build-{logical_id}", f"BUILD_PY={sys.executable}"], cwd=checkout, env=env)
    return out


def test_the_function_ships_the_application_and_its_requirements_only(artifact: Path) -> None:
    top = {path.name for path in artifact.iterdir()}
    assert {"handlers", "flows", "picoflow"} <= top
    assert files_under(artifact / "handlers") == files_under(ROOT / "handlers")
    assert files_under(artifact / "flows") == files_under(ROOT / "flows")
    assert any(name.startswith(f"{DISTRIBUTION.replace('-', '_')}-") and name.endswith(".dist-info") for name in top)
    for absent in ("tests", "benchmarks", "build", ".cache", "ignore", "bin",
                   "Makefile", "template.yaml", "samconfig.toml", "pyproject.toml", "requirements.txt", "README.md"):
        assert absent not in top, absent
    # Of events/, only the model script events/env.json names for `sam local invoke` (no sample events).
    assert files_under(artifact / "events") == {"script.json"}
    # The Lambda runtime includes the AWS SDK; the function uses that copy.
    for sdk in ("boto3", "botocore", "s3transfer"):
        assert sdk not in top
        assert not any(name.startswith(f"{sdk}-") for name in top)
    assert not [path for path in artifact.rglob("*") if path.name == "__pycache__" or path.suffix == ".pyc"]

    size = sum(path.stat().st_size for path in artifact.rglob("*") if path.is_file())
    assert size < LAMBDA_UNZIPPED_LIMIT, f"{size / 1e6:.0f} MB unzipped"


def test_the_build_writes_nothing_into_the_checkout(artifact: Path) -> None:
    # sam runs the target in the checkout itself (samconfig.toml: build_in_source), for several functions at once:
    # the library is built from a copy, so no build/ or metadata of it lands here, and what was there stays.
    checkout = artifact.parent / "checkout"
    assert not list(checkout.glob("*.egg-info"))
    assert sorted(path.relative_to(checkout).as_posix() for path in (checkout / "build").rglob("*")) == [
        "build/lib", "build/lib/handlers", "build/lib/handlers/stale.py"]


def test_the_function_stays_lean(artifact: Path, tmp_path: Path) -> None:
    # Measured at 75.8 MB unzipped and 22.3 MB zipped (docs/get-started/deploy.md); a new dependency that
    # grows the function by a tenth fails here, so its size is a decision rather than an accident.
    unzipped = sum(path.stat().st_size for path in artifact.rglob("*") if path.is_file())
    archive = shutil.make_archive(str(tmp_path / "function"), "zip", artifact)
    zipped = Path(archive).stat().st_size
    assert unzipped < FUNCTION_UNZIPPED_BUDGET, f"{unzipped / 1e6:.1f} MB unzipped"
    assert zipped < FUNCTION_ZIPPED_BUDGET, f"{zipped / 1e6:.1f} MB zipped"
    # The sizes the deploy page states are this build's, to the size of a patch release of a dependency (2 %).
    page = (ROOT / "docs" / "get-started" / "deploy.md").read_text(encoding="utf-8")
    stated = re.search(r"measured ([\d.]+) MB unzipped and ([\d.]+) MB zipped", page)
    assert stated is not None
    assert abs(float(stated[1]) * 1e6 - unzipped) <= 0.02 * unzipped, f"{unzipped / 1e6:.1f} MB unzipped"
    assert abs(float(stated[2]) * 1e6 - zipped) <= 0.02 * zipped, f"{zipped / 1e6:.1f} MB zipped"
    for left_out in ("zstandard", "pycparser", "google/api_core", "google/auth", "pyasn1"):
        assert not (artifact / left_out).exists(), left_out


def lock_pins() -> dict[str, tuple[str, list[str]]]:
    """requirements.txt's requirements: normalised name -> (pinned version, hashes)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = (ROOT / "requirements.txt").read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        requirement, *options = line.split(" --hash=")
        name, version = requirement.strip().split("==")
        pins[canonical(name)] = (version.strip(), [option.split()[0] for option in options])
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_functions_requirements_are_a_hashed_lock_of_the_projects_dependencies() -> None:
    from packaging.requirements import Requirement

    pins = lock_pins()
    assert pins and all(hashes and all(h.startswith("sha256:") for h in hashes) for _, hashes in pins.values())
    left_out = set(re.search(r"^LOCK_LEFT_OUT := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
                   .group(1).split())
    assert not left_out & set(pins)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for dependency in map(Requirement, project["dependencies"]):
        if canonical(dependency.name) in left_out:
            continue
        version, _ = pins[canonical(dependency.name)]
        assert dependency.specifier.contains(version, prereleases=True), (dependency, version)
    # The build installs exactly the lock, checking every hash, and the library itself without dependencies.
    build = re.search(r"^build-ApiFunction:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
    assert "--require-hashes --no-deps" in build and "-r requirements.txt" in build


def test_the_functions_compiled_modules_match_its_runtime(
    artifact: Path, template_function: tuple[str, dict]
) -> None:
    _, resource = template_function
    version = resource["Properties"]["Runtime"].removeprefix("python").replace(".", "")
    (architecture,) = resource["Properties"]["Architectures"]
    elf_machine = {"arm64": 183, "x86_64": 62}[architecture]
    extensions = [path for path in artifact.rglob("*.so") if path.is_file()]
    assert extensions  # pydantic-core at least
    for path in extensions:
        header = path.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == elf_machine, path
        tag = re.search(r"\.cpython-(\d+)-", path.name)
        assert tag is None or tag.group(1) == version, path
