"""Run tally: what an RL run's step records in `metrics.jsonl` add up to (rollouts run, failed by kind, scored, mean
reward), for the headline `tracegym rl` prints at the end and its exit code.

Every rollout a step ran counts, its empty attempts' (`regeneration`) included; a step made again after a resume
counts once (its last record). The unit is the learner's rollout (a multi-agent episode's trainable members' traces),
and, for multi-agent environments, also the episode: one lost whole (its env-server request failed) leaves no
learner trace to count, so episodes are tallied beside rollouts (`episode_errors` of `episodes`). The failed share
is over the whole run, with `tracegym eval`'s meaning (`--max-error-rate`, `core.error_rate.failed_share`); a step
whose every rollout failed already stopped the run (`orchestrator.check_not_all_failed`).

>>> tally = RunTally.of([{"step": 0, "rollouts": 8, "rollouts_failed": 2, "failed/model_unavailable": 2,
...                       "reward": 0.5}])
>>> tally.headline()
'1 step, 6 of 8 rollouts scored (2 failed: model_unavailable 2); reward 0.500'
>>> tally.too_many_failed(0.2)
'2 of 8 rollouts failed (25%), more than --max-error-rate 0.2 allows'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tracegym.core.error_rate import failed_share

FAILED = "failed/"
"""The prefix of a step record's count of one failure kind (`orchestrator.step_metrics`)."""


@dataclass
class RunTally:
    """Totals over an RL run's steps."""

    steps: int = 0
    rollouts: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    """Failed rollouts by failure kind."""
    reward_sum: float = 0.0
    """Sum of the scored rollouts' rewards (a step's `reward` is the mean over its scored ones)."""
    episodes: int = 0
    episodes_failed: int = 0

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> RunTally:
        """The tally of a run's `metrics.jsonl` records: its step records and its empty attempts' (held-out and
        other records are not the training rollouts)."""
        latest: dict[tuple[int, int], dict[str, Any]] = {}
        for record in records:
            if "rollouts" not in record:
                continue
            if "step" in record:
                latest[record["step"], -1] = record
            elif "empty_batch" in record:
                latest[record["empty_batch"], record.get("attempt", 0)] = record
        tally = cls(steps=len({step for step, attempt in latest if attempt == -1}))
        for record in latest.values():
            tally.add(record)
        return tally

    def add(self, record: dict[str, Any]) -> None:
        """One attempt's record."""
        failed = int(record.get("rollouts_failed", 0))
        self.rollouts += int(record["rollouts"])
        self.failed.update({k.removeprefix(FAILED): int(v) for k, v in record.items() if k.startswith(FAILED)})
        if record.get("reward") is not None:
            self.reward_sum += record["reward"] * (int(record["rollouts"]) - failed)
        self.episodes += int(record.get("episodes", 0))
        self.episodes_failed += int(record.get("episode_errors", 0))

    @property
    def scored(self) -> int:
        """Rollouts whose reward counts (not failed)."""
        return self.rollouts - self.failed.total()

    @property
    def reward(self) -> float | None:
        """Mean reward of the scored rollouts over the whole run; None when none was scored."""
        return self.reward_sum / self.scored if self.scored else None

    def headline(self) -> str:
        """One line: steps, rollouts scored ("n of m" when some failed, with the failure kinds), mean reward."""
        steps = f"{self.steps} step{'s' * (self.steps != 1)}"
        if not self.failed:
            scored = f"{self.rollouts} rollouts, all scored"
        else:
            kinds = ", ".join(f"{kind} {n}" for kind, n in self.failed.most_common())
            scored = f"{self.scored} of {self.rollouts} rollouts scored ({self.failed.total()} failed: {kinds})"
        games = f"; {self.episodes_failed} of {self.episodes} episodes failed" if self.episodes_failed else ""
        reward = "none scored" if self.reward is None else f"{self.reward:.3f}"
        return f"{steps}, {scored}{games}; reward {reward}"

    def too_many_failed(self, max_error_rate: float) -> str | None:
        """One line saying the run failed when more than `max_error_rate` of its rollouts, or of its multi-agent
        episodes, failed; None when neither did."""
        return (failed_share(self.failed.total(), self.rollouts, "rollouts", max_error_rate)
                or failed_share(self.episodes_failed, self.episodes, "episodes", max_error_rate))
