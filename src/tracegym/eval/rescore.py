"""Rescore: recompute rewards and metrics of stored traces with the current taskset code, without the model.

Each trace gets a fresh Task. Tasks that keep state in an environment instance (class-based environments)
have it rebuilt by replay: `setup` (reset with the task's fields), then every tool call of the trace's
main branch again, in order; the tools' outputs are not compared. Rewards and metrics computed by scorers are
replaced; the loop's own counts (tool calls, tool errors) and the trace's other errors are kept. A trace that
ended on an error or timeout stays unscored, as it was.
"""

from __future__ import annotations

import asyncio

from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.envs.environment import EnvironmentTask
from tracegym.envs.rollout import LOOP_METRICS, Timeouts, score
from tracegym.envs.task import Task
from tracegym.envs.taskset import Taskset

UNSCORED = {StopReason.ERROR, StopReason.TIMEOUT, StopReason.CANCELLED, None}


async def rescore_trace(taskset: Taskset, trace: Trace, timeouts: Timeouts) -> Trace:
    """A copy of `trace` scored by the taskset's current scorers."""
    new = trace.model_copy(deep=True)
    new.rewards = {}
    new.metrics = {k: v for k, v in trace.metrics.items() if k in LOOP_METRICS}
    new.errors = [e for e in trace.errors if not e.stage.startswith(("scoring:", "rescore"))]
    try:
        task = taskset.task(new.task)
    except Exception as exc:
        new.errors.append(TraceError(kind=ErrorKind.TASK, stage="rescore", message=f"{type(exc).__name__}: {exc}"))
        return new
    if trace.stop_reason in UNSCORED:
        for scorer in task.scorers:
            if scorer.kind == "reward":
                new.rewards[scorer.name] = RewardScore(score=None, weight=scorer.weight)
            elif scorer.kind == "metric":
                new.metrics[scorer.name] = None
        return new
    try:
        await _replay(task, new, timeouts)  # setup and every tool call carry their own timeouts
        await score(task, new, timeouts.scoring)
    except Exception as exc:
        new.errors.append(TraceError(kind=ErrorKind.TASK, stage="rescore", message=f"{type(exc).__name__}: {exc}"))
    finally:
        await task.cleanup()
    return new


async def rescore(taskset: Taskset, traces: list[Trace], timeouts: Timeouts, concurrency: int = 32) -> list[Trace]:
    """Every trace rescored, in the same order, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(trace: Trace) -> Trace:
        async with gate:
            return await rescore_trace(taskset, trace, timeouts)

    return list(await asyncio.gather(*(one(t) for t in traces)))


async def _replay(task: Task, trace: Trace, timeouts: Timeouts) -> None:
    """Rebuild an environment's state: setup, then the trace's tool calls in order (others need nothing)."""
    if not isinstance(task, EnvironmentTask):
        return
    await asyncio.wait_for(task.setup(), timeouts.setup)
    for message in trace.messages:
        for call in message.tool_calls:
            tool = task.tool(call.name)
            if tool is None:
                continue
            try:
                await asyncio.wait_for(tool.call(call.parsed_arguments()), timeouts.tool)
            except Exception:  # it failed in the rollout too (the model saw an error); replay goes on the same way
                continue

