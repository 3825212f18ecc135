"""Seat metrics: one step's multi-agent figures per member (seat) and for the learner: reward, win / draw / loss
and forfeit rates, parse errors, and the advantages training gave.

Keys are `seat/<member>/<figure>` and `learner/<figure>` (the learner: every member that trained in an episode,
pooled, so a learner that changes seats from episode to episode is followed across them). A rate is over the
episodes whose outcome for that member is known; a figure with nothing to average is left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from tracegym.core.episode import Episode, Outcome
from tracegym.train.fan_out import TrainingUnit

PARSE_ERRORS = "parse_errors"
"""The member metric counting a member's turns whose markup did not parse (kept, masked from training)."""


def seat_metrics(episodes: list[Episode], advantaged: Iterable[tuple[TrainingUnit, float]]) -> dict[str, Any]:
    """Per-seat and learner figures of a step's episodes and the (unit, advantage) pairs it trained on."""
    by_member = list(dict.fromkeys(m for e in episodes for m in e.members))
    advantages: dict[str, list[float]] = {}
    for unit, advantage in advantaged:
        advantages.setdefault(unit.member or "", []).append(advantage)
    out: dict[str, Any] = {}
    for member in by_member:
        seats = [(e, member) for e in episodes if member in e.members]
        out.update(figures(f"seat/{member}/", seats, advantages.get(member, [])))
    learner = [(e, m) for e in episodes for m in e.trainable_members]
    out.update(figures("learner/", learner, [a for values in advantages.values() for a in values]))
    return out


def figures(prefix: str, seats: list[tuple[Episode, str]], advantages: list[float]) -> dict[str, Any]:
    """The figures of one member (or the learner) over the (episode, member) pairs it sat in."""
    rewards = [r for e, m in seats if (r := e.rewards.get(m)) is not None]
    outcomes = [o for e, m in seats if (o := e.outcomes.get(m)) is not None]
    out: dict[str, Any] = {"episodes": len(seats),
                           "parse_errors": sum(e.member_metrics.get(m, {}).get(PARSE_ERRORS) or 0 for e, m in seats)}
    if rewards:
        out["reward"] = statistics.fmean(rewards)
    if outcomes:
        for outcome in Outcome:
            out[f"{outcome.value}_rate"] = sum(o == outcome for o in outcomes) / len(outcomes)
    if advantages:
        out["advantage_mean"] = statistics.fmean(advantages)
        out["advantage_std"] = statistics.pstdev(advantages)
        out["advantage_abs_mean"] = statistics.fmean(abs(a) for a in advantages)
    return {prefix + name: value for name, value in out.items()}
