"""Benchmark helpers: a DynamoDB client whose calls cost nothing, and CPU metering of model calls.

``FreeDynamoDBClient`` stands in for the boto3 client of ``DynamoDBSessionStore``: it keeps items in a dict
and answers ``get_item``/``put_item``/``delete_item`` (with the store's conditions) at once, so a turn on it
costs everything the store does (document encoding, zlib, item building, size checks) except the two
storage requests themselves. ``MeteredChatModel`` wraps a chat model so that the CPU spent inside model calls
(the LangChain call machinery and the model itself) can be taken out of a turn's CPU: what is left is the
framework's own work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError


class FreeDynamoDBClient:
    """The subset of the DynamoDB client the session store uses, in process memory, with its conditions."""

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
                raise ClientError({"Error": {"Code": "ConditionalCheckFailedException", "Message": ""}}, "PutItem")
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
