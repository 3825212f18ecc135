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

from tracegym.core.episode import Episode
from tracegym.core.seat_tally import PARSE_ERRORS, SeatTally
from tracegym.train.fan_out import TrainingUnit


def seat_metrics(episodes: list[Episode], advantaged: Iterable[tuple[TrainingUnit, float]]) -> dict[str, Any]:
    """Per-seat and learner figures of a step's episodes and the (unit, advantage) pairs it trained on."""
    by_member = list(dict.fromkeys(m for e in episodes for m in e.members))
    advantages: dict[str, list[float]] = {}
    for unit, advantage in advantaged:
        advantages.setdefault(unit.member or "", []).append(advantage)
    out: dict[str, Any] = {}
    for member in by_member:
        seats = SeatTally.of((e, member) for e in episodes if member in e.members)
        out.update(figures(f"seat/{member}/", seats, advantages.get(member, [])))
    learner = SeatTally.of((e, m) for e in episodes for m in e.trainable_members)
    out.update(figures("learner/", learner, [a for values in advantages.values() for a in values]))
    return out


def figures(prefix: str, tally: SeatTally, advantages: list[float]) -> dict[str, Any]:
    """The figures of one member (or the learner) from its tally and the advantages it trained with."""
    out: dict[str, Any] = {"episodes": tally.episodes, PARSE_ERRORS: int(tally.metrics[PARSE_ERRORS])}
    if tally.rewards:
        out["reward"] = statistics.fmean(tally.rewards)
    out.update({f"{outcome.value}_rate": rate for outcome, rate in tally.outcome_rates().items()})
    if advantages:
        out["advantage_mean"] = statistics.fmean(advantages)
        out["advantage_std"] = statistics.pstdev(advantages)
        out["advantage_abs_mean"] = statistics.fmean(abs(a) for a in advantages)
    return {prefix + name: value for name, value in out.items()}
