"""A taskset whose reward reads a file outside the task (a grader state the policy could write to): an empty reply
earns 1 once the file exists. Served by an env server in the canary-wire tests (`SPEC`)."""

from __future__ import annotations

import random
from pathlib import Path

from tracegym import Task, TaskData, Taskset, TasksetConfig, Trace, reward

SPEC = f"{Path(__file__)}:Leaky"


class LeakyConfig(TasksetConfig):
    """Options of the leaky taskset."""

    num_tasks: int = 2
    leak: str = ""
    """A path: while a file is there, every reply earns 1."""


class LeakyTask(Task[TaskData, LeakyConfig]):
    """Say the answer; paid for it, or for anything once the leak file exists."""

    @reward
    def correct(self, trace: Trace) -> float:
        leaked = bool(self.config.leak) and Path(self.config.leak).exists()
        return float(leaked or trace.last_reply.strip() == self.data.answer)


def make_row(rng: random.Random, cfg: LeakyConfig, index: int) -> TaskData:
    return TaskData(id=f"t{index}", prompt=f"Say {index}.", answer=str(index))


class Leaky(Taskset[LeakyConfig]):
    id = "leaky"
    task_class = LeakyTask
    row_maker = make_row
