"""A taskset whose scores report the sandbox admission of the worker process that ran the rollout."""

from __future__ import annotations

from collections.abc import Iterable

from tracegym import Task, TaskData, Taskset, Trace, metric, reward
from tracegym.runtimes.admission import admission


class AdmissionProbeTask(Task):
    """Any reply; its reward is its worker's starts at once, its metrics what that worker was configured with."""

    @reward
    async def starts_at_once(self, trace: Trace) -> float:
        return float(admission().slots)

    @metric
    async def share(self, trace: Trace) -> float:
        return float(admission().share)

    @metric
    async def warm_pool(self, trace: Trace) -> float:
        return float(admission().config.warm_pool)


class AdmissionProbe(Taskset):
    id = "admission-probe"
    task_class = AdmissionProbeTask

    def load(self) -> Iterable[TaskData]:
        return [TaskData(id=str(i), prompt=f"Say word{i}.") for i in range(4)]
