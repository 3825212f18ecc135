"""A taskset whose sync metric never returns for words starting with `hang` (each such rollout abandons a thread)."""

import threading

from tracegym.core.trace import Trace
from tracegym.envs.scorers import metric
from tracegym.testing.echo import Echo, EchoTask


class HangingTask(EchoTask):
    """An echo task whose metric hangs (until the process ends) when its word starts with `hang`."""

    @metric
    def hangs(self, trace: Trace) -> float:
        if str(self.data.answer).startswith("hang"):
            threading.Event().wait()
        return 0.0


class HangingMetric(Echo):
    """Echo tasks with a metric that may hang."""

    id = "hanging-metric"
    task_class = HangingTask
