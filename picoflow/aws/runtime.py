"""The container's engine: built once from the environment, run on one long-lived event loop.

``SESSION_STORE``/``SESSION_TABLE`` pick the store, ``FILES_BUCKET`` (or ``FILES_FOLDER``) the file store,
``PICOFLOW_FLOWS`` the flow modules, ``PICOFLOW_DECISION_PROVIDERS`` the decision providers,
``PICOFLOW_SCRIPT`` a scripted model for offline runs, and ``OPENAI_API_KEY_PARAMETER`` (or any other key
variable's ``_PARAMETER``) the SSM SecureString holding a model key: read when a model is first built, kept for
``PICOFLOW_PARAMETER_MAX_AGE`` seconds, and read again after a failure (``picoflow.models.parameters``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from picoflow import FlowEngine
from picoflow.aws.discovery import (
    DECISION_PROVIDERS_VARIABLE,
    FLOWS_VARIABLE,
    load_decision_providers,
    load_flows,
)
from picoflow.aws.observability import logger
from picoflow.files.factory import file_store_from_env
from picoflow.files.policy import FilePolicy
from picoflow.models.factory import default_registry
from picoflow.models.parameters import ParameterEnviron
from picoflow.session.factory import store_from_env

# The store is local (SQLite or memory) or DynamoDB: a read for the local inspector that takes longer fails.
SESSION_READ_TIMEOUT_SECONDS = 10.0

T = TypeVar("T")


class Runtime:
    """The engine plus the event loop it lives on, shared by every invocation of this container.

    One long-lived loop (on its own thread) keeps the async HTTP clients that the engine caches with
    its chat models usable across invocations; a loop per invocation would strand their connections.
    """

    def __init__(
        self, engine: FlowEngine, file_policy: FilePolicy | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.engine = engine
        #: The environment the engine was built from, its parameter values kept, so a rebuild reads nothing again.
        self.environ = engine_environment(environ)
        #: The limits files sent to the API must meet (``PICOFLOW_FILE_TYPES`` and friends).
        self.file_policy = file_policy or FilePolicy.from_env()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="picoflow-engine-loop", daemon=True).start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the engine's loop; ``TimeoutError`` (and the task cancelled) after ``timeout``."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The container's ``Runtime``, whose engine is built from the environment on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            env = engine_environment()
            _runtime = Runtime(build_engine(env), environ=env)
        return _runtime


def reset_runtime() -> None:
    """Drop the container's ``Runtime`` (its loop stopped): the next invocation builds one from the environment.

    For tests and tools that run the handler under several environments in one process.
    """
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.loop.call_soon_threadsafe(_runtime.loop.stop)
        _runtime = None


def get_engine() -> FlowEngine:
    """The container's ``FlowEngine``."""
    return get_runtime().engine


def engine_environment(environ: Mapping[str, str] | None = None) -> ParameterEnviron:
    """``environ`` (default: the process environment) in which each key variable ``X`` unset but with
    ``X_PARAMETER`` set reads from that SSM parameter, when a model needs it (never now)."""
    if isinstance(environ, ParameterEnviron):
        return environ
    return ParameterEnviron(environ)


def build_engine(environ: Mapping[str, str] | None = None) -> FlowEngine:
    """A new engine configured from ``environ`` (default: the process environment)."""
    env = engine_environment(environ)
    plain = env.plain
    flows = load_flows(plain.get(FLOWS_VARIABLE))
    # A Lambda execution environment runs one invocation at a time.
    store = store_from_env(plain, one_turn_at_a_time=True)
    decisions = load_decision_providers(plain.get(DECISION_PROVIDERS_VARIABLE), env)
    engine = FlowEngine(
        flows=flows, session_store=store, providers=default_registry(env), decision_providers=decisions,
        file_store=file_store_from_env(plain), file_budget=FilePolicy.from_env(plain).max_request_bytes,
    )
    logger.info("Engine ready", extra={"flows": engine.get_flow_names(), "store": type(engine.session_store).__name__})
    return engine


def read_session(session_id: str) -> dict[str, Any] | None:
    """The JSON form of the stored session ``session_id``, read through the container's engine and loop.

    None when there is none, or when an authenticated principal created it: a reader outside the API has
    no caller to compare with, exactly like an anonymous request. ``TimeoutError`` when the store stalls.
    """
    runtime = get_runtime()
    doc = runtime.call(runtime.engine.session_store.load(session_id), timeout=SESSION_READ_TIMEOUT_SECONDS)
    if doc is None or doc.owner is not None:
        return None
    return doc.to_json_dict()
