"""Validation: whether a taskset's rewards can be trusted before anything trains on them: each task's gold reply
(`Task.gold`) must pass, and an agent that does nothing (an empty reply every turn) must not earn reward. A task that
pays for no action is free reward an RL run will find; a task whose gold fails cannot teach anything."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.canary import GOLD, NOOP, CanaryAgent, canary_model
from tracegym.envs.evaluate import run_rollout
from tracegym.envs.group_scoring import group_scorers, score_group
from tracegym.envs.rollout import Timeouts
from tracegym.envs.taskset import Taskset


@dataclass
class TaskCheck:
    """One task's two rollouts: the gold agent's (None when the task has no gold reply) and the no-op agent's."""

    key: str
    gold: Trace | None
    noop: Trace


@dataclass
class Validation:
    """The checks of a taskset's tasks, judged by `pass_threshold` (a gold reward below it fails) and `noop_max`
    (a no-op reward above it passes, which it must not)."""

    taskset: str
    pass_threshold: float
    noop_max: float
    checks: list[TaskCheck] = field(default_factory=list)
    group_scorers: list[str] = field(default_factory=list)
    """The taskset's group rewards and metrics: scored on each agent's rollout as a group of one."""

    def gold_failed(self) -> list[TaskCheck]:
        """Tasks whose gold reply did not earn `pass_threshold` (an error or an unscored reward fails too)."""
        return [c for c in self.checks if c.gold is not None and not _at_least(c.gold, self.pass_threshold)]

    def noop_passed(self) -> list[TaskCheck]:
        """Tasks that paid the no-op agent more than `noop_max`."""
        return [c for c in self.checks if c.noop.reward is not None and c.noop.reward > self.noop_max]

    def noop_errored(self) -> list[TaskCheck]:
        """Tasks whose no-op rollout failed (an error, not a low reward): what they would pay is unknown."""
        return [c for c in self.checks if c.noop.failure is not None]

    def without_gold(self) -> list[TaskCheck]:
        return [c for c in self.checks if c.gold is None]

    @property
    def clean(self) -> bool:
        return not (self.gold_failed() or self.noop_passed() or self.noop_errored())

    def lines(self) -> list[str]:
        """The report: one line of counts per check, then one line per flagged task."""
        n, gold = len(self.checks), len(self.checks) - len(self.without_gold())
        out = [f"validate {self.taskset}: {n} tasks",
               f"  gold:  {gold - len(self.gold_failed())} of {gold} passed (reward >= {self.pass_threshold:g})"
               + (f"; {n - gold} have no gold reply (Task.gold), not checked" if gold < n else ""),
               f"  no-op: {len(self.noop_passed())} of {n} paid more than {self.noop_max:g} for an empty reply"
               + (f"; {len(self.noop_errored())} failed" if self.noop_errored() else "")]
        if self.group_scorers:
            out.append(f"  group scorers ({', '.join(self.group_scorers)}) scored each rollout as a group of one")
        out += [f"  gold fails   {c.key}: {_outcome(c.gold)}" for c in self.gold_failed() if c.gold is not None]
        out += [f"  no-op passes {c.key}: {_outcome(c.noop)}" for c in self.noop_passed()]
        out += [f"  no-op failed {c.key}: {_outcome(c.noop)}" for c in self.noop_errored()]
        return out


async def validate(taskset: Taskset, rows: Sequence[TaskData], *, pass_threshold: float = 1.0, noop_max: float = 0.0,
                   timeouts: Timeouts | None = None, concurrency: int = 8) -> Validation:
    """Run the gold and no-op agents on every row (in this process, at most `concurrency` rollouts at once); each
    rollout is its own group (a group of one) for the taskset's group rewards."""
    gate = asyncio.Semaphore(concurrency)
    timeouts = timeouts or Timeouts()

    async def agent(row: TaskData, name: CanaryAgent) -> Trace | None:
        model = canary_model(name, taskset, row)
        if model is None:
            return None
        async with gate:
            trace = await run_rollout(taskset, row, model, timeouts=timeouts, infra_retries=0)
            await score_group(taskset, [trace], timeouts.scoring)
            return trace

    async def check(row: TaskData) -> TaskCheck:
        gold, noop = await asyncio.gather(agent(row, GOLD), agent(row, NOOP))
        assert noop is not None
        return TaskCheck(key=row.key, gold=gold, noop=noop)

    checks = await asyncio.gather(*(check(row) for row in rows))
    return Validation(taskset=taskset.id, pass_threshold=pass_threshold, noop_max=noop_max, checks=list(checks),
                      group_scorers=[s.name for s in group_scorers(taskset)])


def _at_least(trace: Trace, threshold: float) -> bool:
    return trace.failure is None and trace.reward is not None and trace.reward >= threshold


def _outcome(trace: Trace) -> str:
    if trace.failure is not None:
        first = trace.errors[0] if trace.errors else None
        return f"{trace.failure.value}" + (f" ({first.stage}: {first.message})" if first else "")
    return f"reward {trace.reward}"
