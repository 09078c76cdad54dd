"""Benchmark helpers: a DynamoDB client whose calls cost nothing, and CPU metering of model calls.

``FreeDynamoDBClient`` stands in for the boto3 client of ``DynamoDBSessionStore``: it keeps items in a dict
and answers ``get_item``/``put_item``/``delete_item`` (with the store's conditions) at once, so a turn on it
costs everything the store does (document encoding, zlib, item building, size checks) except the two
storage requests themselves. ``MeteredChatModel`` wraps a chat model so that the CPU spent inside model calls
(the LangChain call machinery and the model itself) can be taken out of a turn's CPU: what is left is the
framework's own work.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from botocore.exceptions import ClientError


class _ConditionalCheckFailedException(ClientError):
    """What botocore's modeled exception is: a ``ClientError`` subclass the store catches by name."""


class _Exceptions:
    ConditionalCheckFailedException = _ConditionalCheckFailedException


class FreeDynamoDBClient:
    """The subset of the DynamoDB client the session store uses, in process memory, with its conditions."""

    exceptions = _Exceptions()

    def __init__(self) -> None:
        self.items: dict[str, dict[str, dict[str, Any]]] = {}
        self.calls = 0
        self._lock = threading.Lock()

    def get_item(self, *, TableName: str, Key: dict[str, Any], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        with self._lock:
            item = self.items.get(Key["id"]["S"])
        if item is None:
            return {}
        return {"Item": {"revision": dict(item["revision"]), "doc": dict(item["doc"])}}

    def put_item(self, *, TableName: str, Item: dict[str, Any], ConditionExpression: str = "",  # noqa: N803
                 ExpressionAttributeValues: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        key = Item["id"]["S"]
        with self._lock:
            stored = self.items.get(key)
            if ConditionExpression.startswith("attribute_not_exists"):
                ok = stored is None
            else:
                values = ExpressionAttributeValues or {}
                ok = (
                    stored is not None
                    and stored["revision"]["N"] == values[":expected"]["N"]
                    and stored["flowName"]["S"] == values[":flow"]["S"]
                )
            if not ok:
                error = {"Error": {"Code": "ConditionalCheckFailedException", "Message": ""}}
                raise _ConditionalCheckFailedException(error, "PutItem")
            self.items[key] = dict(Item)
        return {}

    def delete_item(self, *, TableName: str, Key: dict[str, Any], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        with self._lock:
            self.items.pop(Key["id"]["S"], None)
        return {}

    def close(self) -> None:
        """Nothing to release."""


class CpuMeter:
    """Process CPU seconds spent inside metered calls (every thread, like the turn measurement)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def take(self) -> float:
        taken, self.seconds = self.seconds, 0.0
        return taken


class _MeteredRunnable:
    """A bound chat model whose ``invoke``/``ainvoke`` add their CPU time to a meter."""

    def __init__(self, inner: Any, meter: CpuMeter) -> None:
        self._inner = inner
        self._meter = meter

    def invoke(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self._inner.invoke(messages, *args, **kwargs)
        finally:
            self._meter.seconds += time.process_time() - started

    async def ainvoke(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return await self._inner.ainvoke(messages, *args, **kwargs)
        finally:
            self._meter.seconds += time.process_time() - started


class MeteredChatModel:
    """Hands out metered tool bindings of ``model`` (the only way either benchmarked side calls its model).

    Binding itself (converting the tool definitions) is left unmetered: PicoFlow binds before every call,
    LangGraph's graph once when it is built, and that difference is part of the frameworks.
    """

    def __init__(self, model: Any, meter: CpuMeter) -> None:
        self._model = model
        self._meter = meter

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> _MeteredRunnable:
        return _MeteredRunnable(self._model.bind_tools(tools, **kwargs), self._meter)

    def invoke(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return _MeteredRunnable(self._model, self._meter).invoke(messages, *args, **kwargs)

    async def ainvoke(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        return await _MeteredRunnable(self._model, self._meter).ainvoke(messages, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


TRACE_HEADER_VARIABLE = "_X_AMZN_TRACE_ID"


def trace_as_deployed() -> Callable[[], None]:
    """Instrument this process as ``template.yaml`` deploys the function: X-Ray tracing active.

    In Lambda, Powertools' ``Tracer`` patches every library the X-Ray SDK knows (botocore among them), and each
    invocation arrives with a trace header; every DynamoDB request then records a subsegment, which the SDK
    sends over UDP to the daemon address. This does the same outside Lambda: the SDK in its Lambda mode, its
    patches applied, segments sent to a loopback port nobody reads. The returned function starts a new,
    sampled trace (the worst case for cost: every turn traced); call it before each turn, as Lambda does.
    """
    os.environ.setdefault("LAMBDA_TASK_ROOT", os.getcwd())
    os.environ["AWS_XRAY_DAEMON_ADDRESS"] = "127.0.0.1:2000"
    os.environ.pop("AWS_XRAY_SDK_ENABLED", None)
    from aws_xray_sdk.core import patch_all

    patch_all()

    def new_trace() -> None:
        now = int(time.time())
        os.environ[TRACE_HEADER_VARIABLE] = (
            f"Root=1-{now:08x}-{uuid.uuid4().hex[:24]};Parent={uuid.uuid4().hex[:16]};Sampled=1"
        )

    new_trace()  # set-up requests (tables, warm-up) are traced too, as an invocation's would be
    return new_trace
