"""Evaluate: run groups of rollouts over a taskset in process, with bounded concurrency.

`evaluate_iter` yields traces as they finish (for stores and dashboards); `evaluate` returns them in task
order. A rollout that fails is a trace with errors, never an exception that cancels its siblings. A rollout
that ended on an infrastructure error (endpoint down) is rerun with a fresh Task up to `infra_retries` times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

from tracegym.core.errors import ErrorKind, TraceError, TracegymError, UsageError
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Trace
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import Timeouts, rollout
from tracegym.envs.taskset import Taskset
from tracegym.envs.thread_lane import contained_call
from tracegym.models.client import ModelClient

X = TypeVar("X")
R = TypeVar("R")


async def run_rollout(
    taskset: Taskset,
    data: TaskData,
    model: ModelClient,
    sampling: Sampling | None = None,
    *,
    rollout_index: int = 0,
    timeouts: Timeouts | None = None,
    infra_retries: int = 1,
) -> Trace:
    """One rollout of one task, rerun on infrastructure errors at most `infra_retries` times."""
    for attempt in range(infra_retries + 1):
        try:
            task = contained_call(taskset.task, data)
        except Exception as exc:  # a row the taskset cannot build a Task from fails this rollout only
            return failed_trace(data, taskset.id, rollout_index, exc)
        trace = await rollout(task, model, sampling, rollout_index=rollout_index, timeouts=timeouts)
        if not trace.has_error(ErrorKind.INFRASTRUCTURE) or attempt == infra_retries:
            return trace
    raise AssertionError("unreachable")


def failed_trace(data: TaskData, taskset_id: str, rollout_index: int, exc: BaseException) -> Trace:
    """A trace for a rollout that could not start, carrying the error."""
    kind = exc.kind if isinstance(exc, TracegymError) else ErrorKind.TASK
    error = TraceError(kind=kind, stage="setup", message=f"{type(exc).__name__}: {exc}")
    return Trace(task=data, taskset=taskset_id, rollout_index=rollout_index, errors=[error],
                 stop_reason=StopReason.ERROR)


def bounded_taskset(taskset: str | Taskset, num_tasks: int | None, need_bound: bool = True) -> Taskset:
    """The taskset, cut to its first `num_tasks`; an infinite one without a bound is a UsageError."""
    ts = load_taskset(taskset)
    if num_tasks is not None:
        return ts.head(num_tasks)
    if need_bound and not ts.bounded:
        raise UsageError(f"taskset {ts.id!r} is infinite: give num_tasks")
    return ts


async def run_group(
    taskset: Taskset,
    data: TaskData,
    model: ModelClient,
    rollouts: int,
    sampling: Sampling | None = None,
    **options: Any,
) -> list[Trace]:
    """`rollouts` rollouts of one task, concurrently; traces in rollout-index order."""
    return list(
        await asyncio.gather(
            *(run_rollout(taskset, data, model, sampling, rollout_index=i, **options) for i in range(rollouts))
        )
    )


async def evaluate_iter(
    taskset: str | Taskset,
    model: ModelClient,
    *,
    num_tasks: int | None = None,
    rollouts: int = 1,
    sampling: Sampling | None = None,
    concurrency: int = 32,
    pairs: Iterable[tuple[TaskData, int]] | None = None,
    **options: Any,
) -> AsyncIterator[Trace]:
    """Yield traces as they finish. `pairs` (task, rollout index) replaces the default cross product, e.g. to
    rerun only what a resumed run is missing. Tasks are read lazily; at most `concurrency` run at once."""
    ts = bounded_taskset(taskset, num_tasks, need_bound=pairs is None)
    work = iter(pairs if pairs is not None else ((d, i) for d in ts for i in range(rollouts)))

    async def one(item: tuple[TaskData, int]) -> Trace:
        data, index = item
        try:
            return await run_rollout(ts, data, model, sampling, rollout_index=index, **options)
        except Exception as exc:  # a bug below must still answer, or the consumer would wait forever
            return failed_trace(data, ts.id, index, exc)

    async for trace in as_finished(work, one, concurrency):
        yield trace


async def as_finished(items: Iterator[X], run: Callable[[X], Awaitable[R]], concurrency: int,
                      size: Callable[[X], int] | None = None) -> AsyncIterator[R]:
    """`run(item)` for every item, results yielded as they finish, the items running at once taking at most
    `concurrency` in all: each takes `size(item)` (default 1; a group of rollouts takes its length), and one
    item always runs even if it is bigger. Items are drawn lazily (one ahead); when the consumer stops early,
    the runs still going are cancelled. `run` must not raise."""
    done: asyncio.Queue[tuple[R, int]] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()

    async def one(item: X, n: int) -> None:
        await done.put((await run(item), n))

    in_flight = 0
    upcoming = next(items, None)
    try:
        while True:
            while upcoming is not None:
                n = size(upcoming) if size is not None else 1
                if in_flight and in_flight + n > concurrency:
                    break
                job = asyncio.create_task(one(upcoming, n))
                running.add(job)
                job.add_done_callback(running.discard)
                in_flight += n
                upcoming = next(items, None)
            if not in_flight:
                return
            result, n = await done.get()
            in_flight -= n
            yield result
    finally:
        for job in running:
            job.cancel()


async def evaluate(
    taskset: str | Taskset,
    model: ModelClient,
    *,
    num_tasks: int | None = None,
    rollouts: int = 1,
    sampling: Sampling | None = None,
    concurrency: int = 32,
    **options: Any,
) -> list[Trace]:
    """Run `rollouts` rollouts of each of the first `num_tasks` tasks; traces in task order, then index."""
    ts = bounded_taskset(taskset, num_tasks)
    tasks = list(ts)
    pairs = [(d, i) for d in tasks for i in range(rollouts)]
    traces = [
        t async for t in evaluate_iter(ts, model, sampling=sampling, concurrency=concurrency, pairs=pairs,
                                       **options)
    ]
    position = {d.key: n for n, d in reversed(list(enumerate(tasks)))}
    return sorted(traces, key=lambda t: (position.get(t.task_key, 0), t.rollout_index))
