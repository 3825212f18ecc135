"""Signal: what a training mode makes of a step's groups, the one thing the modes do not share (DESIGN.md, Signal).

The orchestrator runs every mode alike: it draws tasks, runs their groups against the endpoint the signal names
(`rollout_endpoint`: the policy, or an `sft` run's teacher), screens them with the rollout filters, hands them to
`samples`, keeps the samples fresh enough, hands those to `finish`, and writes what came out. It never asks which
mode it runs. Three signals implement the protocol:

- `RLSignal` (`rl`, this module): group advantages over the trainable members of each group's episodes (a
  single-agent rollout's solo episode has one), then every branch of each as a sample carrying its advantage;
- `SFTSignal` (`sft`, `train.sft`): the teacher's rollouts, filtered, rendered for the student;
- `OPDSignal` (`opd`, `train.distillation`): RL's samples, each token's advantage then set from the teacher's
  logprob of it (`finish`).

A signal keeps whatever state outlives a step (EMA baselines, counts) in `state_dict`, saved with the trainer's
checkpoint. Its metrics join the step's record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tracegym.core.cut_policy import KEEP, CutPolicy
from tracegym.core.episode import Episode
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.models.endpoint import Endpoint
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.fan_out import MASKED_AS, TrainingUnit, advantaged, episode_units
from tracegym.train.regeneration import Metrics, rollouts_fate
from tracegym.train.samples import checked_samples
from tracegym.train.seat_metrics import seat_metrics

Group = list[Episode]
"""The episodes of one task (a single-agent environment's: its rollouts, each the solo episode `Episode.solo`)."""
NO_SIGNAL = "groups_without_signal"
"""The step metric counting groups whose advantages had no signal (every reward the same)."""


@dataclass(frozen=True)
class StepGroups:
    """One attempt at a step's batch: its groups, and which trainable traces the rollout filters keep."""

    step: int
    groups: list[Group]
    keeps: Callable[[Trace], bool] = lambda trace: True


class Signal(Protocol):
    """A training mode's part of a step: what to roll out against, and what samples the groups give."""

    def rollout_endpoint(self, policy: Endpoint) -> Endpoint:
        """The endpoint a step's groups run against, given the policy served now."""
        ...

    async def samples(self, step: StepGroups, version: int) -> tuple[list[Sample], Metrics]:
        """The samples of one attempt's groups, stamped with the policy `version` served when the step started
        where their turns record none, and the signal's figures of them."""
        ...

    async def finish(self, samples: list[Sample]) -> tuple[list[Sample], Metrics]:
        """The step's samples once the stale ones are gone, completed (e.g. a teacher's per-token advantages)."""
        ...

    def why_empty(self, tried: Sequence[Metrics]) -> str:
        """Why every attempt at a step came out empty, from the attempts' metrics."""
        ...

    def counts(self) -> dict[str, int]:
        """What the signal has left out of training so far, by cause (run totals)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    async def aclose(self) -> None:
        ...


@dataclass
class RLSignal:
    """Rewards to advantages: per group (per baseline key within it: a task, or a member of a task), over the
    episode members that trained; every branch of each as a sample with that advantage.
    `baseline_per_task`: an episode member's baseline per task (else per taskset and member); `truncated_reward`:
    the reward of a trainable member of an episode cut short (None: its payoff); `cuts`: the reward or mask of a
    rollout by its cut (overlong, length, unparsable; masked ones counted as `masked/<cut>` in the step's
    figures); `log`: where a trace whose tokens cannot be trained on is reported, with its step (a `metrics.jsonl`
    record)."""

    advantages: GroupAdvantages
    baseline_per_task: bool = True
    truncated_reward: float | None = None
    cuts: CutPolicy = KEEP
    per_episode: tuple[str, ...] = ()
    """Member patterns grouped per episode (hierarchical groups: `AdvantageConfig.per_episode`)."""
    log: Callable[[dict[str, Any]], None] = lambda record: None
    traces_invalid: int = 0
    """Traces dropped so far because their tokens are unfit for training (`samples.validate`)."""

    def rollout_endpoint(self, policy: Endpoint) -> Endpoint:
        return policy

    async def samples(self, step: StepGroups, version: int) -> tuple[list[Sample], Metrics]:
        before = self.advantages.filtered
        pairs, dropped = self.advantaged(step.groups)
        samples: list[Sample] = []
        for unit, advantage in pairs:
            if step.keeps(unit.trace):
                samples += self.trace_samples(unit.trace, advantage, version, step.step)
        metrics: Metrics = {NO_SIGNAL: self.advantages.filtered - before,
                            **{reason: n for reason, n in sorted(dropped.items()) if reason.startswith(MASKED_AS)}}
        games = [e for g in step.groups for e in g if not e.is_solo]
        if games:
            metrics.update(episode_metrics(games, pairs, dropped))
        return samples, metrics

    async def finish(self, samples: list[Sample]) -> tuple[list[Sample], Metrics]:
        return samples, {}

    def advantaged(self, groups: Sequence[Group]) -> tuple[list[tuple[TrainingUnit, float]], Counter[str]]:
        """Each group fanned out into training units (one per trainable member of each episode), with the
        advantages of each baseline key within the group; and what made no unit, by reason."""
        out: list[tuple[TrainingUnit, float]] = []
        dropped = Counter[str]()
        for group in groups:
            units, left_out = episode_units(group, self.baseline_per_task, self.truncated_reward, self.cuts,
                                            self.per_episode)
            out += advantaged(units, self.advantages)
            dropped += left_out
        return out, dropped

    def trace_samples(self, trace: Trace, advantage: float, version: int, step: int = 0) -> list[Sample]:
        """The trace's samples with loss, carrying its advantage and reward, each stamped with the oldest policy
        version that sampled its branch (`version` where none was reported); an untrainable trace is counted."""
        samples, problems = checked_samples(trace)
        if problems:  # not exactly trainable (e.g. no logprobs, greedy): dropped and counted
            self.traces_invalid += 1
            self.log({"step": step, "invalid_trace": problems[0], "problems": len(problems)})
        stamp = {"advantage": advantage, "reward": trace.reward}
        return [s.model_copy(update={**stamp, "policy_version": version if s.policy_version is None
                                     else s.policy_version}) for s in samples if s.num_trained]

    def why_empty(self, tried: Sequence[Metrics]) -> str:
        return rollouts_fate(list(tried), sum(m.get(NO_SIGNAL, 0) for m in tried))

    def counts(self) -> dict[str, int]:
        return {"groups_filtered": self.advantages.filtered, "traces_invalid": self.traces_invalid}

    def state_dict(self) -> dict[str, Any]:
        return {"advantages": self.advantages.state_dict(), "traces_invalid": self.traces_invalid}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.advantages.load_state_dict(state["advantages"])
        self.traces_invalid = int(state["traces_invalid"])

    async def aclose(self) -> None:
        return None


def learner_traces(group: Group) -> list[Trace]:
    """The traces of a group that training looks at: each episode's trainable members' (a rollout's own)."""
    return [e.traces[m] for e in group for m in e.trainable_members if m in e.traces]


def episode_metrics(episodes: list[Episode], pairs: list[tuple[TrainingUnit, float]],
                    dropped: Counter[str]) -> dict[str, Any]:
    """A step's multi-agent figures, from its multi-agent `episodes` (a step of rollouts has none): episodes, their
    errors (`episodes_failed/<kind>`: each kind of error that ended one, e.g. `env_server_error` for an episode
    whose env-server request failed, whose members' traces are not the learner's and so not in `failed/<kind>`),
    members left out of training by reason, per seat."""
    failed = Counter(e.error.failure.value for e in episodes if e.error is not None)
    return {"episodes": len(episodes), "episode_errors": failed.total(),
            **{f"episodes_failed/{kind}": n for kind, n in sorted(failed.items())},
            **{f"members_left_out/{reason}": n for reason, n in sorted(dropped.items())},
            **seat_metrics(episodes, pairs)}
