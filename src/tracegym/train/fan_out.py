"""Fan-out: what training makes of a group's episodes: one training unit per trace that trains (per trainable
member of each; a single-agent rollout's solo episode has one), grouped per baseline key (taskset, task, member) for
the advantages.

A unit is a member's own trace (its branches give its samples with its exact tokens) and its reward. A rollout
or member that failed outside the model (`Trace.failure`), an episode that ended on an error (a failed slot, a
verdict that did not parse, a member's endpoint down), a member whose turn never came (`no_turns`: the game
ended first) and a reward that was never decided make no unit; each is counted by reason. Members the episode
marks untrainable make none either: a seat pinned to another model, an opponent, a judge (its `Member.trainable`
is off unless the run's seat binding says `trainable = true`). Which seats train is decided once, by the seat
binding, and recorded on the episode. Advantages are whatever `GroupAdvantages` computes over each group's
rewards: fan-out and the advantage estimator do not know of each other.

A unit's reward is its payoff, or what the run's cut policy (`core.cut_policy`) makes of its trace's cut
(overlong, length, unparsable): kept, replaced by a number, or masked (no unit, counted as `masked/<cut>`).

A solo episode's unit is what the rollout alone always made: judged by its own trace (`unfit`), paid its own
reward, its baseline kept per task without a member (so a stateful baseline's keys, and its checkpointed state,
are a rollout's).

>>> units, dropped = episode_units([episode])  # doctest: +SKIP
>>> [(u.member, u.reward) for u in units]  # doctest: +SKIP
[('player_0', 1.0), ('player_1', -1.0)]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tracegym.core.cut_policy import KEEP, MASKED, CutPolicy
from tracegym.core.episode import Episode
from tracegym.core.trace import StopReason, Trace
from tracegym.train.advantages import GroupAdvantages, baseline_key, episode_group_key

MASKED_AS = "masked/"
"""The reason (`masked/<cut>`) a unit the cut policy masks is left out for."""


@dataclass(frozen=True)
class TrainingUnit:
    """One trace training uses, with the reward its advantage comes from and the key of its baseline."""

    trace: Trace
    reward: float
    key: str
    """`baseline_key(taskset, task key, member)`: units with one key share a baseline."""
    member: str | None = None
    """The member whose trace this is (`SOLO` for a single-agent rollout's)."""


def episode_units(episodes: Iterable[Episode], per_task: bool = True, truncated_reward: float | None = None,
                  cuts: CutPolicy = KEEP, per_episode: Sequence[str] = ()) -> tuple[list[TrainingUnit], Counter[str]]:
    """The units of a group of episodes (one per trainable member of each), and what was left out, by reason
    (`episode_error` counts a member of an episode that ended on an error; `masked/<cut>` one whose trace's cut
    the `cuts` policy masks). `per_task=False` keys a multi-agent member's baseline per (taskset, member) alone, as
    SPIRAL does (one baseline per game and role). `truncated_reward`: the reward of every trainable member of a
    multi-agent episode cut short (a reply ran into the completion budget, a prompt no longer fit), in place of its
    payoff; None keeps the payoff (an unfinished game's, usually 0). `cuts`: the reward (or mask) of a unit by its
    own trace's cut (`Trace.cut`), where `truncated_reward` did not decide it. `per_episode`: member patterns whose
    units are grouped per episode (hierarchical groups, `advantages.episode_group_key`)."""
    units, dropped = [], Counter[str]()
    for episode in episodes:
        for member in episode.trainable_members:
            reason = member_unfit(episode, member)
            reward = MASKED if reason else unit_reward(episode, member, truncated_reward, cuts)
            if reward == MASKED:
                dropped[reason or f"{MASKED_AS}{episode.traces[member].cut}"] += 1
                continue
            key = unit_key(episode, member, per_task, per_episode)
            units.append(TrainingUnit(episode.traces[member], float(reward), key, member))
    return units, dropped


def unit_reward(episode: Episode, member: str, truncated_reward: float | None,
                cuts: CutPolicy) -> float | Literal["mask"]:
    """The reward a trainable member's unit counts with: `truncated_reward` for a multi-agent episode cut short
    (when set), else the member's payoff as the `cuts` policy has it for its trace's cut (`MASKED`: none)."""
    if truncated_reward is not None and not episode.is_solo and episode.stop_reason == StopReason.TRUNCATED:
        return truncated_reward
    payoff = episode.rewards[member]
    assert payoff is not None  # member_unfit: a member without one is left out
    return cuts.reward(episode.traces[member].cut, payoff)


def unit_key(episode: Episode, member: str, per_task: bool, per_episode: Sequence[str] = ()) -> str:
    """The baseline key of a member's unit: `baseline_key(taskset, task key, member)`, the task left out when not
    `per_task`; the episode's own group when `per_episode` matches the member; a solo episode's is its rollout's,
    `taskset/task key`."""
    if episode.is_solo:
        return baseline_key(episode.taskset, episode.task_key)
    grouped = episode_group_key(episode.taskset, episode.task_key, episode.id, member, per_episode)
    if grouped is not None:
        return grouped
    return baseline_key(episode.taskset, episode.task_key if per_task else "", member)


def unfit(trace: Trace) -> str | None:
    """Why a rollout cannot be trained on (its `Trace.failure`, or `no_reward`), or None when it can."""
    if trace.failure is not None:
        return trace.failure
    return "no_reward" if trace.reward is None else None


def member_unfit(episode: Episode, member: str) -> str | None:
    """Why a member's part of an episode cannot be trained on, or None when it can. A solo episode's one member is
    judged by its own trace alone (`unfit`), as a rollout is: it has no game to end before its turn."""
    trace = episode.traces.get(member)
    if trace is None:
        return "no_trace"
    if episode.is_solo:
        return unfit(trace)
    if episode.error is not None:
        return "episode_error"
    if not any(node.sampled for node in trace.graph.nodes):  # the episode ended before its turn: nothing sampled
        return "no_turns"
    return unfit(trace) or ("no_reward" if episode.rewards.get(member) is None else None)


def by_key(units: Iterable[TrainingUnit]) -> list[list[TrainingUnit]]:
    """Units grouped by baseline key, groups in the order their keys first appear, units in their own order."""
    groups: dict[str, list[TrainingUnit]] = {}
    for unit in units:
        groups.setdefault(unit.key, []).append(unit)
    return list(groups.values())


def advantaged(units: Iterable[TrainingUnit], advantages: GroupAdvantages) -> list[tuple[TrainingUnit, float]]:
    """Each unit with its advantage, computed per baseline key over that key's rewards in order; the units of
    a group the advantages filter out (no signal) are left out."""
    out: list[tuple[TrainingUnit, float]] = []
    for group in by_key(units):
        values = advantages([u.reward for u in group], key=group[0].key)
        if values is not None:
            out += zip(group, values, strict=True)
    return out
