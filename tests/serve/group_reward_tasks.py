"""A taskset with a group reward (the group's longest reply) and, when its config names a judge endpoint, a judge
reward: served by an env server in the group-reward tests (`SPEC`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tracegym import Endpoint, Judge, Task, TaskData, Taskset, TasksetConfig, Trace, reward
from tracegym.tasksets.debate import Debate, DebateTask

SPEC = f"{Path(__file__)}:ranked"


class RankedConfig(TasksetConfig):
    """Options of the ranked taskset."""

    num_tasks: int = 2
    judge: Endpoint | None = None
    """The judge model's endpoint; None: no judge reward."""


class RankedTask(Task[TaskData, RankedConfig]):
    """Answer anything: paid by length, and for being the group's longest."""

    @reward
    def length(self, trace: Trace) -> float:
        return float(len(trace.last_reply))

    @reward(group=True)
    def longest(self, traces: list[Trace]) -> list[float]:
        best = max(len(t.last_reply) for t in traces)
        return [float(len(t.last_reply) == best) for t in traces]


def make_row(rng: random.Random, cfg: RankedConfig, index: int) -> TaskData:
    return TaskData(id=f"t{index}", prompt=f"Say something {index}.", answer="4")


class Ranked(Taskset[RankedConfig]):
    id = "ranked"
    task_class = RankedTask
    row_maker = make_row


def ranked(config: Any = None) -> Ranked:
    """The ranked taskset, with its judge reward when the config names a judge."""
    plain = Ranked(config)
    judge = plain.config.judge
    return plain if judge is None else Ranked(plain.config, rewards=[Judge(judge)])


class ComparedDebate(DebateTask):
    """A debate with a group reward, which a multi-agent taskset cannot have."""

    @reward(group=True)
    def compared(self, traces: list[Trace]) -> list[float]:
        return [0.0] * len(traces)


class GroupedDebate(Debate):
    task_class = ComparedDebate


MULTI_AGENT_SPEC = f"{Path(__file__)}:GroupedDebate"
