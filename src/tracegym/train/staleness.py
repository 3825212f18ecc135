"""Staleness control: how far the orchestrator may run ahead of the trainer, and which samples are too old to train.

Policy version `v` is the weights after `v` optimizer steps; trainer step `n` (from 0) turns version `n` into
`n + 1`. A sample's staleness at step `n` is `n - sample.policy_version`. With `max_async_steps = k` the
orchestrator may start producing the batch for step `n` once the trainer has reached version `n - k`, so every
sample it produces for step `n` has staleness <= k; samples older than that (left over from a slow group, a
resumed run) are dropped and counted. `k = 0` is fully on-policy.

>>> control = StalenessControl(max_async_steps=1)
>>> control.may_start(step=3, trainer_version=2), control.may_start(step=4, trainer_version=2)
(True, False)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tracegym.core.errors import UsageError
from tracegym.core.sample import Sample


class StalenessControl:
    """Pure bookkeeping for the orchestrator: when to start a step's batch, and which samples it may keep."""

    def __init__(self, max_async_steps: int = 1) -> None:
        if max_async_steps < 0:
            raise UsageError(f"max_async_steps must be >= 0, got {max_async_steps}")
        self.max_async_steps = max_async_steps
        self.dropped = 0
        """Samples dropped so far for being too stale."""

    def oldest_version(self, step: int) -> int:
        """The oldest policy version whose samples step `step` may train on."""
        return max(0, step - self.max_async_steps)

    def may_start(self, step: int, trainer_version: int) -> bool:
        """True when the batch for `step` may be produced while the trainer's weights are `trainer_version`."""
        return step - trainer_version <= self.max_async_steps

    def staleness(self, sample: Sample, step: int) -> int:
        """Steps between the weights that sampled `sample` and those that train on it at `step`."""
        if sample.policy_version is None:
            raise UsageError("a training sample has no policy_version; the orchestrator must stamp every sample")
        return step - sample.policy_version

    def admit(self, samples: Iterable[Sample], step: int) -> list[Sample]:
        """The samples fresh enough for step `step`; the rest are dropped and counted in `dropped`."""
        kept = []
        for sample in samples:
            if self.staleness(sample, step) <= self.max_async_steps:
                kept.append(sample)
            else:
                self.dropped += 1
        return kept

    def state_dict(self) -> dict[str, Any]:
        return {"max_async_steps": self.max_async_steps, "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dropped = int(state["dropped"])
