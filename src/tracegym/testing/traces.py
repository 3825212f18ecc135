"""Trace builders: finished traces made in one call, for tests of stores, reports and training."""

from __future__ import annotations

from typing import Any

from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, StopReason, Trace


def make_trace(
    prompt: str = "question",
    reply: str = "answer",
    *,
    reward: float | None = 1.0,
    task: TaskData | None = None,
    rollout_index: int = 0,
    error: ErrorKind | None = None,
    stop_reason: StopReason = StopReason.COMPLETED,
    taskset: str = "test",
    **fields: Any,
) -> Trace:
    """A single-turn trace with one reward named `reward` (None = unscored) and optionally one error."""
    data = task or TaskData(prompt=prompt)
    trace = Trace(task=data, taskset=taskset, rollout_index=rollout_index, stop_reason=stop_reason, **fields)
    trace.graph.add(user(prompt))
    trace.prompt_length = 1
    trace.graph.add(assistant(reply), sampled=True)
    trace.rewards["reward"] = RewardScore(score=reward)
    if error is not None:
        trace.errors.append(TraceError(kind=error, stage="model", message=f"scripted {error.value} error"))
        trace.stop_reason = StopReason.ERROR
    return trace
