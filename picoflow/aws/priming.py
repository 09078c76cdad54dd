"""Priming: the work a container's first turn would otherwise pay, done before any request arrives.

Inside Lambda (``AWS_LAMBDA_INITIALIZATION_TYPE`` is set) the handler module calls ``install()`` at import:

- with SnapStart (``snap-start``) ``prime`` runs as a before-snapshot hook, so every restored copy starts primed,
  and ``refresh`` as an after-restore hook, so no two copies share a connection, a credential or random state;
- otherwise (on-demand or provisioned concurrency) ``prime`` runs there and then, during init.

Priming runs two turns of a private flow (a tool call, then a continued session) through the API's routes
against an in-memory store and a scripted model, which loads and exercises the turn path (request models,
engine, tools, document encoding, envelopes) without a network call or a write to the real table; then it
builds the clients the registered flows' first turn would build: the store's DynamoDB client and each flow's
chat models. ``PICOFLOW_PRIME=false`` turns it off; ``true`` turns it on outside Lambda too.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field, SecretStr

from picoflow import Flow, FlowEngine, ModelSelection, Step, ToolSpec, Transition, stay, tool
from picoflow.aws.api import app
from picoflow.aws.apigw import FakeLambdaContext, http_event
from picoflow.aws.observability import logger, metrics
from picoflow.aws.runtime import Runtime, build_engine, get_runtime
from picoflow.models.registry import ProviderRegistry
from picoflow.models.scripted import ScriptedProvider
from picoflow.session.dynamodb_store import DynamoDBSessionStore
from picoflow.stores import MemorySessionStore
from picoflow.wire import SESSION_HEADER

PRIME_VARIABLE = "PICOFLOW_PRIME"
INIT_TYPE_VARIABLE = "AWS_LAMBDA_INITIALIZATION_TYPE"
SNAP_START = "snap-start"
#: Seconds the after-restore hook waits for the stale store to close; Lambda allows the hook 10 s in all.
CLOSE_TIMEOUT_SECONDS = 3.0
#: Seconds a stubbed request (no network) may take before priming gives it up.
STUBBED_TIMEOUT_SECONDS = 5.0
PRIMING_SESSION_ID = "picoflow-priming"
#: The answer of the offline OpenAI call: a Chat Completions body.
PRIMING_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-priming", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
}

# Two turns: a tool call and the reply after it, then a continued session's reply.
PRIMING_SCRIPT: list[dict[str, Any]] = [
    {"content": "", "tool_calls": [{"name": "greet", "args": {"name": "Ada"}, "id": "call_priming"}],
     "usage": {"input_tokens": 12, "output_tokens": 6}},
    {"content": "Hello, Ada.", "usage": {"input_tokens": 20, "output_tokens": 4}},
    {"content": "Goodbye.", "usage": {"input_tokens": 28, "output_tokens": 3}},
]


class GreetArgs(BaseModel):
    """The priming tool's arguments."""

    name: str = Field(min_length=1, description="Who to greet")


class GreetingStep(Step):
    """One conversational step offering one tool: the shape of most first turns."""

    def get_prompt(self) -> str:
        return "Greet the user by name with the greet tool."

    def define_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="greet", description="Greet someone by name", schema=GreetArgs)]

    @tool
    async def greet(self, args: dict[str, Any]) -> Transition:
        self.save_state({"name": args["name"]})
        return stay(f"Greeted {args['name']}.")


class PrimingFlow(Flow):
    """The private flow priming runs; it is never registered with the container's engine."""

    id = "PicoFlowPriming"

    def config_model(self) -> ModelSelection:
        return ModelSelection(provider="scripted", name="priming")

    def define_steps(self) -> list[Step]:
        return [GreetingStep(self).use_memory("priming")]


def install(environ: Mapping[str, str] | None = None) -> str:
    """Arrange priming for this container: ``"snapshot"`` (SnapStart hooks registered), ``"init"`` (primed now)
    or ``"off"`` (outside Lambda, or ``PICOFLOW_PRIME=false``)."""
    env = os.environ if environ is None else environ
    setting = (env.get(PRIME_VARIABLE) or "").strip().lower()
    init_type = env.get(INIT_TYPE_VARIABLE)
    if setting in {"false", "0", "no", "off"} or (not init_type and setting not in {"true", "1", "yes", "on"}):
        return "off"
    hooks = _snapshot_hooks() if init_type == SNAP_START else None
    if hooks is not None:
        before_snapshot, after_restore = hooks
        before_snapshot(prime)
        after_restore(refresh)
        return "snapshot"
    prime()
    return "init"


def _snapshot_hooks() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        # Shipped by Lambda's Python runtimes that support SnapStart; absent elsewhere.
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:
        return None
    return register_before_snapshot, register_after_restore


def prime() -> None:
    """Run the priming turns and build the registered flows' clients; a failure is logged, never raised."""
    runtime = get_runtime()
    started = time.process_time()
    try:
        dry_turns(runtime)
    except Exception as exc:  # noqa: BLE001 - priming only saves time: the container must start without it
        logger.warning("Priming turns failed", extra={"errorType": type(exc).__name__})
    prime_clients(runtime)
    logger.info("Primed", extra={"cpuMs": round((time.process_time() - started) * 1000, 1)})


def refresh() -> None:
    """After a restore: reseed ``random`` and replace the engine, so its clients open their own connections and
    resolve their own credentials; then build those clients, as ``prime`` did before the snapshot."""
    random.seed()
    runtime = get_runtime()
    stale = runtime.engine
    runtime.engine = build_engine(runtime.environ)
    try:
        runtime.call(stale.close(), timeout=CLOSE_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - the stale engine is dropped either way
        logger.warning("Closing the snapshot's store failed", extra={"errorType": type(exc).__name__})
    prime_clients(runtime)


def dry_turns(runtime: Runtime) -> None:
    """Two turns of ``PrimingFlow`` through the API's route, on a scratch engine that the container's ``runtime``
    (the one the route uses) serves for their duration, on its own loop."""
    scratch = FlowEngine(
        flows=[PrimingFlow], session_store=MemorySessionStore(),
        providers=ProviderRegistry(override=ScriptedProvider(PRIMING_SCRIPT)),
    )
    engine, runtime.engine = runtime.engine, scratch
    try:
        session = _dry_turn("Hi, I am Ada.", None)
        _dry_turn("Bye.", session)
    finally:
        runtime.engine = engine
        # Nothing of the priming turns may reach the first real invocation's metrics or log keys.
        metrics.clear_metrics()
        logger.remove_keys(["session"])


def _dry_turn(message: str, session: str | None) -> str:
    body = {"flowName": PrimingFlow.id, "message": message}
    headers = {SESSION_HEADER: session} if session else None
    response = app.resolve(http_event("POST", "/ai/run", body=body, headers=headers), FakeLambdaContext())
    if response["statusCode"] != 200:
        raise RuntimeError(f"priming turn answered {response['statusCode']}: {json.loads(response['body'])['code']}")
    answered: str = json.loads(response["body"])["session"]
    return answered


def prime_clients(runtime: Runtime) -> None:
    """Build, without a network call, what the registered flows' first turn would: the store's DynamoDB client (and
    its request path, on stubbed answers) and every flow's chat models (and the OpenAI client's request path)."""
    engine = runtime.engine
    if isinstance(engine.session_store, DynamoDBSessionStore):
        try:
            runtime.call(_stubbed_store_requests(engine.session_store), timeout=STUBBED_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the first turn pays what priming could not
            logger.warning("Priming the session store failed", extra={"errorType": type(exc).__name__})
    models = []
    for name in engine.get_flow_names():
        flow_cls = engine.get_flow(name)
        if flow_cls is None:
            continue
        try:
            models += [engine.providers.chat_model(selection) for selection in model_selections(flow_cls)]
        except Exception as exc:  # noqa: BLE001 - the flow's first turn reports what cannot be built
            logger.warning("Priming a chat model failed", extra={"flow": name, "errorType": type(exc).__name__})
    if any(type(model).__module__.startswith("langchain_openai") for model in models):
        try:
            runtime.call(_offline_openai_call(), timeout=STUBBED_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - the first turn pays what priming could not
            logger.warning("Priming the OpenAI client failed", extra={"errorType": type(exc).__name__})


async def _stubbed_store_requests(store: DynamoDBSessionStore) -> None:
    """A turn's requests (load, create, save) through the store and its client, answered by a stub, so the
    client's serializers, endpoint rules and parsers are ready; nothing is sent."""
    from botocore.stub import Stubber

    with Stubber(store.client) as stub:
        for method in ("get_item", "put_item", "put_item"):
            stub.add_response(method, {})
        await store.load(PRIMING_SESSION_ID)
        created = await store.create({"name": PrimingFlow.id}, session_id=PRIMING_SESSION_ID)
        await store.save(created, created.revision)


async def _offline_openai_call() -> None:
    """One chat completion with tools through a ``ChatOpenAI`` talking to a server on loopback inside this process:
    it loads the modules and fills the caches an OpenAI request needs (HTTP pool, request and response models).
    The flows' own models keep their untouched clients; the server and the connection close afterwards."""
    import httpx
    from langchain_openai import ChatOpenAI

    server = await asyncio.start_server(_answer_completion, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            model = ChatOpenAI(
                model_name="gpt-4o-mini", openai_api_key=SecretStr("priming-offline"),
                openai_api_base=f"http://127.0.0.1:{port}/v1", http_async_client=client, max_retries=0,
                request_timeout=STUBBED_TIMEOUT_SECONDS,
            )
            await model.bind_tools([GreetArgs]).ainvoke([("system", "Greet."), ("human", "Hi")])
    finally:
        server.close()
        await server.wait_closed()


async def _answer_completion(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
    await reader.readexactly(int(length.group(1)) if length else 0)
    body = json.dumps(PRIMING_COMPLETION).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )
    await writer.drain()
    writer.close()


def model_selections(flow_cls: type[Flow]) -> list[ModelSelection]:
    """The distinct model selections a new instance of ``flow_cls`` declares (flow, chat steps, summary model);
    none when building the flow needs a request (its config, say)."""
    try:
        flow = flow_cls()
        found: Iterable[ModelSelection | None] = [
            flow.model_selection(),
            *(step.model_selection() for step in flow.define_steps() if not step.is_logic()),
            flow.get_memory().summary_model,
        ]
    except Exception:  # noqa: BLE001 - flow code that needs a request: its first turn builds its models
        return []
    distinct: dict[str, ModelSelection] = {}
    for selection in found:
        if selection is not None:
            distinct.setdefault(selection.model_dump_json(), selection)
    return list(distinct.values())
