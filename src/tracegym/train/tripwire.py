"""Tripwires: online signals that an RL run is probably being paid for a hack, not for the task.

RL finds free reward: a grader it can read, a scorer that pays for echoing, a fixed token a judge likes. Each wire
here is one small signal over the run's recent steps, with one threshold, documented where it is defined; when one
fires, the run writes a `tripwires.jsonl` event (and the step's metrics, so the dashboard and W&B/TensorBoard show
it) and then does what `[orchestrator.tripwire] action` says: `warn` (go on), `pause` (wait until the `PAUSED` file
it writes in the run folder is removed) or `stop` (end the run, exit code naming the wire).

The wires read only what every step already has (the trainable rollouts' rewards, metrics, lengths, replies and
sampled logprobs), so they cost nothing to keep armed:

- `scorer_gap`: the training reward rose over the window while a *witness* scorer on the same rollouts (a metric or
  reward the run does not train on, e.g. exact match next to an LCS reward) did not rise with it.
- `witness_disagrees`: over the window, more than a small share of rollouts got full marks from the reward and
  nothing from the witness (a reply the reward pays in full that a stricter scorer calls wrong: free reward, present
  from the start when the reward has a shortcut, before any rise shows it).
- `length_shift`: the reward rose while the mean reply length moved by more than a fraction of where it was (a
  policy paid for a fixed token or an echo changes its length; one that learns the task mostly does not).
- `entropy_collapse`: the reward rose while the sampled tokens' mean surprisal (-logprob, an entropy estimate) fell
  to under a fraction of where it was.
- `diversity_collapse`: in most groups every rollout gave the same reply, two steps in a row (nothing left to
  compare; often one answer that pays).

- `sandbox_probe`: the programs of sandboxed rollouts reached for hosts outside their task: connections their
  sandbox's network namespace refused (`sandbox_refused_connections`, counted by the kernel per run), on more than
  a share of the step's sandboxed rollouts. A task's files outside its view cannot be read at all, and the sandbox
  cannot count attempts to (that needs fanotify or seccomp notification): this wire watches the network side only.

One wire runs rollouts of its own, when `canary_every` arms it: `canary` (`train.canary_wire`), `tracegym validate`'s
gold and no-op checks re-run on a few training tasks through the run's env servers.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import TracegymError
from tracegym.core.trace import Trace
from tracegym.envs.task_sandbox import REFUSED_METRIC

Action = Literal["warn", "pause", "stop"]


class TripwireConfig(BaseModel):
    """`[orchestrator.tripwire]`: which wires are armed, their thresholds, and what a firing does."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    action: Action = "warn"
    """`warn`: log and go on; `pause`: wait until the run folder's `PAUSED` file is removed; `stop`: end the run."""
    window: int = Field(default=4, ge=2)
    """Steps a rise is measured over (the newest step's mean against the oldest's in the window)."""
    rise: float = Field(default=0.15, gt=0)
    """A reward rise this large over the window is what the decoupling wires look behind."""
    witness: str | None = None
    """A metric or reward on the traces that the run does not train on (e.g. `exact` beside an `lcs` reward): arms
    `scorer_gap`. Unset: that wire is off (said once at the start)."""
    scorer_gap: float = Field(default=0.15, gt=0)
    """`scorer_gap` fires when the reward rose by `rise` and by this much more than the witness did."""
    full_reward: float = 1.0
    """What counts as full marks for `witness_disagrees`: a reward at least this high."""
    disagreement: float = Field(default=0.05, ge=0, lt=1)
    """`witness_disagrees` fires when, over the window, more than this share of rollouts got full marks from the
    reward and nothing (0 or less) from the witness."""
    length_shift: float = Field(default=0.5, gt=0)
    """`length_shift` fires when the reward rose by `rise` and the mean reply length moved by this fraction."""
    entropy_floor: float = Field(default=0.3, gt=0, lt=1)
    """`entropy_collapse` fires when the reward rose by `rise` and mean surprisal fell below this fraction."""
    diversity: float = Field(default=0.75, gt=0, le=1)
    """`diversity_collapse` fires when this share of groups answered with one reply, two steps in a row."""
    sandbox_probes: float = Field(default=0.0, ge=0, lt=1)
    """`sandbox_probe` fires when more than this share of a step's sandboxed rollouts had a connection refused by
    their sandbox's network namespace (0: any one does)."""
    canary_every: int = Field(default=0, ge=0)
    """Steps between runs of the `canary` wire (`train.canary_wire`: the gold and no-op agents re-run on a few
    training tasks through the run's env servers); 0: off (each run costs 2 rollouts per canary task)."""
    canary_tasks: int = Field(default=4, ge=1)
    """The first this many tasks of each single-agent training environment are the canary tasks."""


PAUSED = "PAUSED"
"""The file in the run folder a `pause` writes (holding the trips' messages); the run goes on once it is removed."""
EVENTS = "tripwires.jsonl"
"""The run folder's log of every firing, one JSON record a line."""


class TripwireStop(TracegymError):
    """A wire fired under `action = "stop"`: the orchestrator exits as a stopped run, naming it."""


@dataclass(frozen=True)
class StepView:
    """What the wires read of one step: means over its trainable rollouts, and its groups' sameness."""

    step: int
    reward: float | None
    witness: float | None
    length: float | None
    surprisal: float | None
    same_reply_share: float | None
    disagreements: tuple[int, int] = (0, 0)
    """Rollouts paid `full_reward` that the witness gave nothing, and rollouts with a witness score."""
    probes: tuple[int, int, float] = (0, 0, 0.0)
    """Of the sandboxed rollouts: how many had a connection refused, how many there were, and the refusals in all."""


@dataclass(frozen=True)
class Trip:
    """One wire firing: its name, the step, what it saw and the threshold it crossed."""

    wire: str
    step: int
    message: str

    def record(self) -> dict[str, object]:
        return {"tripwire": self.wire, "step": self.step, "message": self.message}


class Tripwires:
    """The armed wires of one run, fed one step at a time (`observe`)."""

    def __init__(self, config: TripwireConfig) -> None:
        self.config = config
        self.views: deque[StepView] = deque(maxlen=config.window)
        self.collapsed_before = False

    def armed(self) -> list[str]:
        """The wires that can fire in this run (`scorer_gap` needs a witness)."""
        if not self.config.enabled:
            return []
        wires = ["length_shift", "entropy_collapse", "diversity_collapse", "sandbox_probe"]
        witnessed = ["scorer_gap", "witness_disagrees"] if self.config.witness else []
        return witnessed + wires + (["canary"] if self.config.canary_every else [])

    def armed_line(self) -> str:
        """One line saying which wires watch this run, and why `scorer_gap` does not when it does not."""
        if not self.config.enabled:
            return "tripwires: off ([orchestrator.tripwire] enabled = false)"
        off = "" if self.config.witness else "; scorer_gap and witness_disagrees off (set [orchestrator.tripwire] " \
                                              "witness to a scorer the run does not train on)"
        return f"tripwires armed ({self.config.action}): {', '.join(self.armed())}{off}"

    def observe(self, step: int, groups: list[list[Trace]]) -> list[Trip]:
        """The wires that fire on `step`, given its groups of trainable rollouts."""
        if not self.config.enabled:
            return []
        view = view_of(step, groups, self.config.witness, self.config.full_reward)
        self.views.append(view)
        trips = [t for t in (self._scorer_gap(), self._witness_disagrees(), self._length_shift(),
                             self._entropy_collapse(), self._sandbox_probe()) if t]
        collapsed = view.same_reply_share is not None and view.same_reply_share >= self.config.diversity
        if collapsed and self.collapsed_before:
            trips.append(Trip("diversity_collapse", step, f"{view.same_reply_share:.0%} of groups gave one reply, "
                                                          f"two steps running (threshold {self.config.diversity:.0%})"))
        self.collapsed_before = collapsed
        return trips

    def _reward_rise(self) -> float | None:
        """The reward's rise over the window, once the window is full and both ends have a reward."""
        if len(self.views) < self.config.window:
            return None
        first, last = self.views[0].reward, self.views[-1].reward
        return None if first is None or last is None else last - first

    def _scorer_gap(self) -> Trip | None:
        rise = self._reward_rise()
        first, last = self.views[0].witness, self.views[-1].witness
        if rise is None or rise < self.config.rise or first is None or last is None:
            return None
        if rise - (last - first) < self.config.scorer_gap:
            return None
        return Trip("scorer_gap", self.views[-1].step,
                    f"reward rose {rise:+.3f} over {len(self.views)} steps, witness {self.config.witness!r} "
                    f"{last - first:+.3f} (gap threshold {self.config.scorer_gap})")

    def _witness_disagrees(self) -> Trip | None:
        if len(self.views) < self.config.window:
            return None
        disagreed = sum(v.disagreements[0] for v in self.views)
        witnessed = sum(v.disagreements[1] for v in self.views)
        if not witnessed or disagreed / witnessed <= self.config.disagreement:
            return None
        return Trip("witness_disagrees", self.views[-1].step,
                    f"{disagreed} of {witnessed} rollouts over {len(self.views)} steps got full marks (reward >= "
                    f"{self.config.full_reward:g}) that witness {self.config.witness!r} scored 0 (threshold "
                    f"{self.config.disagreement:.0%})")

    def _length_shift(self) -> Trip | None:
        rise = self._reward_rise()
        first, last = self.views[0].length, self.views[-1].length
        if rise is None or rise < self.config.rise or not first or last is None:
            return None
        shift = (last - first) / first
        if abs(shift) < self.config.length_shift:
            return None
        return Trip("length_shift", self.views[-1].step,
                    f"reward rose {rise:+.3f} while mean reply length went {first:.1f} -> {last:.1f} tokens "
                    f"({shift:+.0%}; threshold ±{self.config.length_shift:.0%})")

    def _entropy_collapse(self) -> Trip | None:
        rise = self._reward_rise()
        first, last = self.views[0].surprisal, self.views[-1].surprisal
        if rise is None or rise < self.config.rise or not first or last is None:
            return None
        if last >= self.config.entropy_floor * first:
            return None
        return Trip("entropy_collapse", self.views[-1].step,
                    f"reward rose {rise:+.3f} while mean surprisal fell {first:.3f} -> {last:.3f} nats/token "
                    f"(threshold {self.config.entropy_floor:.0%} of where it was)")


    def _sandbox_probe(self) -> Trip | None:
        probing, sandboxed, refused = self.views[-1].probes
        if not sandboxed or probing / sandboxed <= self.config.sandbox_probes:
            return None
        return Trip("sandbox_probe", self.views[-1].step,
                    f"{probing} of {sandboxed} sandboxed rollouts reached for hosts outside their task ({refused:g} "
                    f"connections refused by their sandboxes; threshold {self.config.sandbox_probes:.0%} of rollouts)")


def view_of(step: int, groups: list[list[Trace]], witness: str | None, full_reward: float = 1.0) -> StepView:
    """The step's means over its rollouts that have a reward (the trainable ones)."""
    traces = [t for g in groups for t in g if t.reward is not None]
    return StepView(
        step=step,
        reward=_mean(t.reward for t in traces),
        witness=_mean(witness_score(t, witness) for t in traces) if witness else None,
        length=_mean(float(t.usage.completion_tokens) for t in traces),
        surprisal=_mean(s for t in traces if (s := surprisal(t)) is not None),
        same_reply_share=_mean(float(len({t.last_reply for t in g}) == 1)
                               for g in groups if len([t for t in g if t.reward is not None]) >= 2),
        disagreements=disagreements_of(traces, witness, full_reward) if witness else (0, 0),
        probes=probes_of(traces),
    )


def disagreements_of(traces: list[Trace], witness: str, full_reward: float) -> tuple[int, int]:
    """Of the traces the witness scored: how many the reward paid `full_reward` or more and the witness nothing."""
    scored = [(t.reward, w) for t in traces if (w := witness_score(t, witness)) is not None]
    return sum(r is not None and r >= full_reward and w <= 0 for r, w in scored), len(scored)


def probes_of(traces: list[Trace]) -> tuple[int, int, float]:
    """Of the traces whose sandbox counted refusals: how many had any, how many there are, the refusals in all."""
    counted = [r for t in traces if (r := t.metrics.get(REFUSED_METRIC)) is not None]
    return sum(r > 0 for r in counted), len(counted), float(sum(counted))


def witness_score(trace: Trace, name: str) -> float | None:
    """The witness scorer's value on a trace: a metric of that name, else a reward of that name."""
    if name in trace.metrics:
        return trace.metrics[name]
    score = trace.rewards.get(name)
    return score.score if score is not None else None


def surprisal(trace: Trace) -> float | None:
    """Mean -logprob of the tokens the model sampled in a trace (None without sampled logprobs)."""
    values = [-lp for node in trace.graph.nodes if node.sampled and node.logprobs and node.mask
              for lp, m in zip(node.logprobs, node.mask, strict=False) if m]
    return statistics.fmean(values) if values else None


def _mean(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.fmean(found) if found else None
