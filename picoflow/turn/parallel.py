"""Work beside the cursor: ``run_step()`` children nested in the executing step, and the ``run_steps()``
barrier that forks one isolated worker per request, waits for all of them and publishes at the join.

A worker runs in an isolated view (``picoflow.turn.worker``: snapshots, private copies, refused writes); its
proposed state changes are validated and published in request order, never in completion order.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from picoflow.authoring.flow import Flow
from picoflow.authoring.run_context import enter_worker_view, execution_frame, execution_frames, worker_view
from picoflow.authoring.step import Step
from picoflow.authoring.step_runs import (
    BranchResult,
    CancellationSignal,
    Checkpoint,
    Contribution,
    FailurePolicy,
    ParallelBatchResult,
    ParallelInvocation,
    RunStepRequest,
    check_depth,
    check_json,
    parallel_settings,
)
from picoflow.conversation.state import SAVE_ON_KEY
from picoflow.errors import (
    ParallelCancelledError,
    ParallelDuplicateKeyError,
    ParallelExecutionError,
    ParallelStateConflictError,
    PicoFlowError,
)
from picoflow.session.document import SequenceItem, format_timestamp
from picoflow.turn.worker import Budget, WorkerView, active_worker, channel_for, new_worker, read_only
from picoflow.validation import validation_problems


async def run_child(flow: Flow, target: type[Step] | str, user_message: str | None = None) -> Any:
    """Run ``target`` in a frame nested in the executing step and return its output.

    Inside a parallel worker this is a one-child atomic barrier, so the child stays isolated too.
    """
    if worker_view(flow) is not None:
        parent = flow.get_executing_step()
        if parent is None:
            raise PicoFlowError(f"Flow '{flow.id}': run_step() in a parallel worker needs the step that calls it.")
        batch = await run_batch(
            parent,
            [RunStepRequest(step=target, user_message=user_message)],
            failure_policy="atomic",
        )
        branch = batch.branches[0]
        if branch.error is not None:
            raise branch.error
        return branch.output
    child = flow.require_step(target)
    frames = execution_frames(flow)
    check_depth(parallel_settings(flow.config_parallel_execution()), flow.id, len(frames) + 1)
    flow.run_context.sequence.append(SequenceItem(level=len(frames) + 2, step_name=child.id))
    with execution_frame(child):
        await child.on_enter()
        try:
            return await child.run(user_message)
        finally:
            await child.on_exit()


# -- the run_steps() barrier ----------------------------------------------------------------------


class _Absent:
    """Marks a state field that a worker removed; copies keep the identity so ``is ABSENT`` holds."""

    def __repr__(self) -> str:
        return "<absent>"

    def __copy__(self) -> _Absent:
        return self

    def __deepcopy__(self, _memo: dict[int, Any]) -> _Absent:
        return self


ABSENT = _Absent()


@dataclass
class _Branch:
    index: int
    key: str
    registered: Step
    worker: Step
    params: dict[str, Any]
    user_message: str | None
    view: WorkerView = field(init=False)
    started: bool = False
    status: Literal["pending", "fulfilled", "rejected"] = "pending"
    output: Any = None
    error: BaseException | None = None

    def reject(self, error: BaseException) -> None:
        self.status, self.error = "rejected", error

    def result(self) -> BranchResult:
        status: Literal["fulfilled", "rejected"] = "fulfilled" if self.status == "fulfilled" else "rejected"
        return BranchResult(self.index, self.key, self.registered.id, status, self.output, self.error)


def _is_framework_failure(error: BaseException | None) -> bool:
    return isinstance(error, ParallelExecutionError)


async def run_batch(
    caller: Step,
    requests: Sequence[Any],
    *,
    failure_policy: FailurePolicy = "retain-successes",
    max_concurrency: int | None = None,
    checkpoint: Checkpoint = "none",
    signal: CancellationSignal | None = None,
) -> ParallelBatchResult:
    """Fork one isolated worker per request, wait for all of them, and publish at the join."""
    flow = caller.flow
    if failure_policy not in ("retain-successes", "atomic"):
        raise ParallelExecutionError("failure_policy must be 'retain-successes' or 'atomic'.")
    if checkpoint not in ("none", "root-join"):
        raise ParallelExecutionError("checkpoint must be 'none' or 'root-join'.")
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
    ):
        raise ParallelExecutionError("max_concurrency must be a positive integer or None.")
    if isinstance(requests, str | bytes) or not isinstance(requests, Sequence):
        raise ParallelExecutionError("run_steps() takes a list of requests.")

    parent = active_worker(flow)
    settings = parallel_settings(flow.config_parallel_execution())
    depth = len(execution_frames(flow)) + 1
    check_depth(settings, flow.id, depth)
    shared = {
        step.id: copy.deepcopy(parent.read(step.id) if parent is not None else step.get_state())
        for step in flow.get_steps()
    }
    branches = _prepare(flow, [_as_request(item) for item in requests], shared)
    budget = parent.budget if parent is not None else Budget(settings.max_invocations)
    budget.reserve(len(branches))
    if not branches:
        return ParallelBatchResult(branches=(), published=False)

    batch_signal = CancellationSignal(signal, parent.invocation.signal if parent is not None else None)
    memory_source = parent.private_memory if parent is not None else flow.get_memory()
    base_path = parent.invocation.path if parent is not None else ()
    for branch in branches:
        view = WorkerView(
            flow, branch.worker, shared=shared, memory_source=memory_source, budget=budget, level=depth + 1
        )
        view.invocation = ParallelInvocation(
            params=read_only(branch.params, view),
            key=branch.key,
            index=branch.index,
            path=(*base_path, branch.index),
            signal=batch_signal,
        )
        # The worker's own state: a private copy of the snapshot, which its step reads and writes in its task.
        view.local[branch.registered.id] = copy.deepcopy(shared[branch.registered.id])
        branch.view = view

    limiter = asyncio.Semaphore(max_concurrency or len(branches))
    tasks = [asyncio.create_task(_run_branch(branch, limiter, batch_signal)) for branch in branches]
    await _wait_all(tasks, batch_signal, settings.cancellation_grace_ms / 1000)
    for branch in branches:
        if branch.status == "pending":
            branch.reject(ParallelCancelledError(f"Branch '{branch.key}' did not stop within the cancellation grace."))
    return await _join(flow, parent, branches, failure_policy, checkpoint, batch_signal.cancelled)


def _as_request(item: Any) -> RunStepRequest:
    if isinstance(item, RunStepRequest):
        return item
    if isinstance(item, Mapping):
        try:
            return RunStepRequest(**item)
        except TypeError as exc:
            raise ParallelExecutionError(f"Invalid run_steps() request: {exc}") from exc
    return RunStepRequest(step=item)


def _prepare(flow: Flow, requests: list[RunStepRequest], shared: Mapping[str, dict[str, Any]]) -> list[_Branch]:
    registered = [flow.require_step(request.step) for request in requests]
    counts = Counter(step.id for step in registered)
    keys: list[str] = []
    for request, step in zip(requests, registered, strict=True):
        if request.key is None:
            if counts[step.id] > 1:
                raise ParallelExecutionError(
                    f"Step '{step.id}' is requested more than once; give each of its requests a unique key."
                )
            keys.append(step.id)
        elif not isinstance(request.key, str) or not request.key.strip():
            raise ParallelExecutionError("A run_steps() branch key must be a non-empty string.")
        else:
            keys.append(request.key.strip())
    duplicate = next((key for key, count in Counter(keys).items() if count > 1), None)
    if duplicate is not None:
        raise ParallelDuplicateKeyError(f"Branch key '{duplicate}' is used by more than one run_steps() request.")

    branches = []
    for index, (request, step, key) in enumerate(zip(requests, registered, keys, strict=True)):
        params = _validated_params(step, key, request.params)
        if request.user_message is not None and not isinstance(request.user_message, str):
            raise ParallelExecutionError(f"The user_message of branch '{key}' must be a string.")
        try:
            # The worker's own state lives in its view (set up by run_batch), not on the instance.
            worker = new_worker(step)
        except Exception as exc:
            raise ParallelExecutionError(f"Cannot create a worker for step '{step.id}': {exc}") from exc
        branches.append(
            _Branch(index=index, key=key, registered=step, worker=worker, params=params,
                    user_message=request.user_message)
        )
    return branches


def _validated_params(step: Step, key: str, params: Any) -> dict[str, Any]:
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ParallelExecutionError(f"The params of branch '{key}' must be a dict.")
    schema = step.parallel_params_schema()
    if schema is not None:
        try:
            validated = schema.model_validate(dict(params))
        except ValidationError as exc:
            problems = validation_problems(exc, "params")
            raise ParallelExecutionError(f"Invalid params for branch '{key}' of step '{step.id}': {problems}") from exc
        params = validated.model_dump(mode="json") if isinstance(validated, BaseModel) else validated
    check_json(params, f"The params of branch '{key}'")
    return copy.deepcopy(dict(params))


async def _run_branch(branch: _Branch, limiter: asyncio.Semaphore, signal: CancellationSignal) -> None:
    async with limiter:
        if signal.cancelled:
            branch.reject(ParallelCancelledError(f"Branch '{branch.key}' was cancelled before it started."))
            return
        view = branch.view
        enter_worker_view(view)
        view.sequence.append(SequenceItem(level=view.level, step_name=branch.worker.id))
        branch.started = True
        worker = branch.worker
        try:
            with execution_frame(worker):
                await worker.on_enter()
                try:
                    output = await worker.run(branch.user_message)
                finally:
                    await worker.on_exit()
        except Exception as exc:  # noqa: BLE001 - every worker failure becomes a rejected branch
            branch.reject(exc)
        else:
            if view.violation is not None:
                branch.reject(view.violation)
            else:
                branch.status, branch.output = "fulfilled", output
        if _is_framework_failure(branch.error):
            # The join will raise anyway: stop queued work from starting.
            signal.cancel(f"branch '{branch.key}' failed: {branch.error}")


async def _wait_all(tasks: list[asyncio.Task[None]], signal: CancellationSignal, grace: float) -> None:
    pending = set(tasks)
    watcher = asyncio.ensure_future(signal.wait())
    try:
        while pending:
            done, _ = await asyncio.wait([*pending, watcher], return_when=asyncio.FIRST_COMPLETED)
            pending -= done
            if watcher in done:
                break
        if pending:
            # Cooperative cancellation: running workers get a grace period, then lose publication rights.
            _, pending = await asyncio.wait(pending, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        watcher.cancel()


async def _join(
    flow: Flow,
    parent: WorkerView | None,
    branches: list[_Branch],
    failure_policy: FailurePolicy,
    checkpoint: Checkpoint,
    cancelled: bool,
) -> ParallelBatchResult:
    # The trace records every branch that started, in request order, whatever happens next.
    sequence = [item for branch in branches if branch.started for item in branch.view.sequence]
    if parent is not None:
        parent.sequence.extend(sequence)
    else:
        flow.run_context.sequence.extend(sequence)
    failure = next((branch.error for branch in branches if _is_framework_failure(branch.error)), None)
    if failure is not None:
        raise failure

    rejected = any(branch.status != "fulfilled" for branch in branches)
    publishing = [] if failure_policy == "atomic" and rejected else [b for b in branches if b.status == "fulfilled"]
    replacements = _replacements(publishing)
    contributions = sorted((c for b in publishing for c in b.view.contributions), key=lambda c: c.path)
    updates = _reduce(flow, parent, replacements, contributions)
    for (step_id, name), (_key, value) in replacements.items():
        updates.setdefault(step_id, {})[name] = value

    if parent is not None:
        for step_id, fields in updates.items():
            _apply_fields(parent.materialize(step_id), fields)
        for step_id, name in replacements:
            parent.touched.setdefault(step_id, set()).add(name)
        parent.contributions.extend(contributions)
        checkpointed = False
    else:
        checkpointed = checkpoint == "root-join"
        await _publish_root(flow, updates, checkpointed)
    return ParallelBatchResult(
        branches=tuple(branch.result() for branch in branches),
        published=bool(publishing),
        checkpointed=checkpointed,
        cancelled=cancelled,
    )


async def _publish_root(flow: Flow, updates: Mapping[str, Mapping[str, Any]], checkpoint: bool) -> None:
    """Write the join's fields into the registered steps; with a checkpoint, save now or roll back."""
    states = {step_id: flow.require_step(step_id).get_state() for step_id in updates}
    previous = {
        step_id: {name: copy.deepcopy(states[step_id].get(name, ABSENT)) for name in [*fields, SAVE_ON_KEY]}
        for step_id, fields in updates.items()
    } if checkpoint else {}
    for step_id, fields in updates.items():
        _apply_fields(states[step_id], fields)
    if not checkpoint:
        return
    try:
        await flow.checkpoint()
    except BaseException:
        for step_id, fields in previous.items():
            _apply_fields(states[step_id], fields, stamp=False)
        raise


def _replacements(publishing: list[_Branch]) -> dict[tuple[str, str], tuple[str, Any]]:
    """Each replaced ``(step id, field)`` with the branch key that replaced it and the new value."""
    found: dict[tuple[str, str], tuple[str, Any]] = {}
    for branch in publishing:
        view = branch.view
        for step_id, names in view.touched.items():
            state = view.read(step_id)
            for name in sorted(names):
                if (step_id, name) in found:
                    raise ParallelStateConflictError(
                        f"Branches '{found[(step_id, name)][0]}' and '{branch.key}' both replace "
                        f"'{step_id}.{name}'. Declare a state channel and use contribute_state() to combine values."
                    )
                value = copy.deepcopy(state.get(name, ABSENT))
                if value is not ABSENT:
                    check_json(value, f"State field '{step_id}.{name}'")
                found[(step_id, name)] = (branch.key, value)
    return found


def _reduce(
    flow: Flow,
    parent: WorkerView | None,
    replacements: Mapping[tuple[str, str], tuple[str, Any]],
    contributions: list[Contribution],
) -> dict[str, dict[str, Any]]:
    """Fold contributions into each channel's current value, in request-path order."""
    reduced: dict[str, dict[str, Any]] = {}
    writers: Counter[tuple[str, str]] = Counter()
    for item in contributions:
        target = (item.step_id, item.channel)
        if target in replacements:
            raise ParallelStateConflictError(
                f"'{item.step_id}.{item.channel}' is both replaced by branch '{replacements[target][0]}' "
                "and reduced from contributions."
            )
        channel = channel_for(flow, item.step_id, item.channel)
        writers[target] += 1
        if channel.single_writer and writers[target] > 1:
            raise ParallelStateConflictError(
                f"Channel '{item.step_id}.{item.channel}' takes a single writer but received several contributions."
            )
        fields = reduced.setdefault(item.step_id, {})
        if item.channel in fields:
            current = fields[item.channel]
        else:
            state = parent.read(item.step_id) if parent is not None else flow.require_step(item.step_id).get_state()
            current = copy.deepcopy(state.get(item.channel))
        try:
            fields[item.channel] = channel.reduce(current, copy.deepcopy(item.value), item.key)
        except ParallelExecutionError:
            raise
        except Exception as exc:
            raise ParallelExecutionError(
                f"The reducer of channel '{item.step_id}.{item.channel}' failed: {type(exc).__name__}: {exc}"
            ) from exc
        check_json(fields[item.channel], f"Channel '{item.step_id}.{item.channel}'")
    return reduced


def _apply_fields(state: dict[str, Any], fields: Mapping[str, Any], *, stamp: bool = True) -> None:
    for name, value in fields.items():
        if value is ABSENT:
            state.pop(name, None)
        else:
            state[name] = copy.deepcopy(value)
    if stamp and fields:
        state[SAVE_ON_KEY] = format_timestamp(datetime.now(UTC))
