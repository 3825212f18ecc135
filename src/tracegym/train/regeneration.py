"""Regeneration: a step whose batch came out empty is made again, with new tasks, a bounded number of times; then
the run stops with the reason, since a run that cannot learn should say so rather than spin.

What makes a batch is any coroutine function `make(attempt) -> (samples, metrics)` (the orchestrator's rollouts,
an SFT run's teacher traces, ...); what explains an empty one is any function of the empty attempts' metrics.

>>> import asyncio
>>> async def nothing(attempt): return [], {"rollouts": 8}
>>> asyncio.run(regenerated(nothing, 2, lambda tried: f"{len(tried)} x {tried[0]['rollouts']} rollouts"))
Traceback (most recent call last):
tracegym.train.regeneration.EmptyBatch: the batch: nothing to train on after 2 attempts: 2 x 8 rollouts
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tracegym.core.errors import TracegymError
from tracegym.train.filters import drops_by_env

S = TypeVar("S")
Metrics = dict[str, Any]
Make = Callable[[int], Awaitable[tuple[list[S], Metrics]]]
"""Makes one attempt (0, 1, ...) at a batch: its samples and its metrics."""

ATTEMPTS_KEY = "batch_attempts"
"""The metric saying how many attempts the handed-over batch took (1: the first one had samples)."""


class EmptyBatch(TracegymError):
    """Every attempt at a step's batch left nothing to train on; the message says what became of the rollouts.
    The orchestrator role exits on it with `STOPPED_EXIT`, and the launcher reports the stop."""


STOPPED_EXIT = 4
"""Exit code of a role that stopped the run on purpose (`EmptyBatch`), not a crash."""


async def regenerated(make: Make[S], attempts: int, why: Callable[[list[Metrics]], str],
                      on_empty: Callable[[int, Metrics], None] = lambda attempt, metrics: None,
                      what: str = "the batch") -> tuple[list[S], Metrics]:
    """The first of at most `attempts` batches from `make` that has samples, with its metrics (plus
    `batch_attempts`); `on_empty(attempt, metrics)` hears of each empty one. When all are empty: `EmptyBatch`
    naming `what` (e.g. `step 3`) and saying `why(metrics of every attempt)`."""
    tried: list[Metrics] = []
    for attempt in range(attempts):
        samples, metrics = await make(attempt)
        if samples:
            return samples, {**metrics, ATTEMPTS_KEY: attempt + 1}
        on_empty(attempt, metrics)
        tried.append(metrics)
    raise EmptyBatch(f"{what}: nothing to train on after {attempts} attempt{'s' * (attempts != 1)}: {why(tried)}")


def rollouts_fate(tried: list[Metrics], no_signal: int | None = None) -> str:
    """What became of the rollouts of a step's empty attempts, from the orchestrator's step metrics: how many
    failed (by reason), how many enforcing filters dropped (per environment and filter), and how many were left
    for groups without signal (`no_signal` of them, when known) or samples too stale or untrainable."""
    total = Counter[str]()
    for metrics in tried:
        total.update({k: v for k, v in metrics.items() if k in ("rollouts", "rollouts_failed", "rollouts_filtered")
                      or k.startswith("failed/")})
    reasons = ", ".join(f"{k.removeprefix('failed/')} {n}" for k, n in sorted(total.items()) if k.startswith("failed/"))
    drops = drops_by_env(tried)
    rest = total["rollouts"] - total["rollouts_failed"] - total["rollouts_filtered"]
    groups = f" ({no_signal} groups had every reward the same)" if no_signal else ""
    return (f"{total['rollouts']} rollouts: {total['rollouts_failed']} failed{f' ({reasons})' if reasons else ''}, "
            f"{total['rollouts_filtered']} dropped by enforced filters{f' ({drops})' if drops else ''}, "
            f"{rest} left without signal{groups} or with samples too stale or untrainable")
