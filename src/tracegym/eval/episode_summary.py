"""Episode summary: the aggregate numbers of a multi-agent eval, per seat (reward with a 95% CI, win / draw /
loss / forfeit rates, parse errors, invalid moves) and per episode (errors, stop reasons, throughput)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, Field
from rich.table import Table

from tracegym.core.episode import Episode, Outcome
from tracegym.core.errors import TraceError
from tracegym.core.interval import mean_ci
from tracegym.core.seat_tally import FORFEITS, INVALID_MOVES, PARSE_ERRORS, SeatTally


class SeatSummary(BaseModel):
    """One seat's figures over the episodes that ended normally."""

    model: str = ""
    """The model the seat was bound to (the last one seen, when it changed)."""
    reward: float | None = None
    """Mean reward over the episodes where it was decided."""
    reward_ci95: float = 0.0
    """Half-width of the 95% confidence interval of `reward` (0 below two)."""
    num_scored: int = 0
    outcomes: dict[str, float] = Field(default_factory=dict)
    """Fraction of the episodes that ended normally with each outcome (win, draw, loss, forfeit); empty when the
    taskset reports none."""
    parse_error_rate: float = 0.0
    """Replies with malformed markup per model turn."""
    forfeit_rate: float = 0.0
    """Episodes it forfeited, per episode that ended normally."""
    invalid_moves: float = 0.0
    """Invalid moves per episode that ended normally."""


class EpisodeSummary(BaseModel):
    """Aggregate numbers of a set of episodes, as written to a multi-agent run folder's `summary.json`."""

    num_episodes: int = 0
    num_ok: int = 0
    """Episodes that ended normally with every reward decided."""
    num_tasks: int = 0
    episodes_per_task: int = 0
    seats: dict[str, SeatSummary] = Field(default_factory=dict)
    """Per seat, in seat order."""
    parse_error_rate: float = 0.0
    """Replies with malformed markup per model turn, over every seat."""
    forfeit_rate: float = 0.0
    """Episodes that ended in a forfeit, per episode that ended normally."""
    errored_episodes: int = 0
    """Episodes that did not end normally (a resume reruns them)."""
    unscored_episodes: int = 0
    """Episodes that ended normally with some member's reward undecided (a reward function that raised)."""
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    """For every error kind seen, how many episodes recorded an error of it (`episode_errors`)."""
    failures: dict[str, int] = Field(default_factory=dict)
    """Episodes that recorded an error, by the failure kind of their first (`episode_errors`)."""
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    wall_time: float | None = None
    episodes_per_second: float | None = None


def summarize_episodes(episodes: Sequence[Episode], *, wall_time: float | None = None) -> EpisodeSummary:
    """Aggregate episodes into an EpisodeSummary (pass one episode per (task key, episode index))."""
    ended = [e for e in episodes if e.ended_normally]
    members = list(dict.fromkeys(m for e in episodes for m in e.members))
    per_task = Counter(e.task_key for e in episodes)
    every_seat = SeatTally.of((e, m) for e in ended for m in e.members)
    return EpisodeSummary(
        num_episodes=len(episodes),
        num_ok=sum(e.ok for e in episodes),
        num_tasks=len(per_task),
        episodes_per_task=max(per_task.values(), default=0),
        seats={m: _seat(ended, m) for m in members},
        parse_error_rate=every_seat.per_turn(PARSE_ERRORS),
        forfeit_rate=sum(Outcome.FORFEIT in e.outcomes.values() for e in ended) / len(ended) if ended else 0.0,
        errored_episodes=len(episodes) - len(ended),
        unscored_episodes=sum(not e.ok for e in ended),
        errors_by_kind=dict(Counter(kind for e in episodes for kind in {x.kind.value for x in episode_errors(e)})),
        failures=dict(sorted(Counter(errors[0].failure.value for e in episodes if (errors := episode_errors(e)))
                             .items())),
        stop_reasons=dict(Counter(e.stop_reason.value if e.stop_reason else "none" for e in episodes)),
        wall_time=wall_time,
        episodes_per_second=len(episodes) / wall_time if wall_time else None,
    )


def episode_errors(episode: Episode) -> list[TraceError]:
    """The errors an episode recorded: its own when one ended it (its members carry copies of it), else each
    member's (a reward or metric that raised after a normal end)."""
    if episode.error is not None:
        return [episode.error]
    return [error for trace in episode.traces.values() for error in trace.errors]


def _seat(ended: list[Episode], member: str) -> SeatSummary:
    mine = [e for e in ended if member in e.members]
    tally = SeatTally.of((e, member) for e in mine)
    reward = mean_ci(tally.rewards)
    return SeatSummary(
        model=next((e.models[member] for e in reversed(mine) if member in e.models), ""),
        reward=reward.mean, reward_ci95=reward.half_width, num_scored=reward.n,
        outcomes={o.value: rate for o, rate in tally.outcome_rates(over=tally.episodes).items()},
        parse_error_rate=tally.per_turn(PARSE_ERRORS),
        forfeit_rate=tally.per_episode(FORFEITS),
        invalid_moves=tally.per_episode(INVALID_MOVES),
    )


def episode_table(summary: EpisodeSummary, title: str = "") -> Table:
    """The summary as a two-column table: each seat's rows, then the episode-wide ones."""
    table = Table(title=title or None, show_header=False)
    table.add_column("name", style="bold")
    table.add_column("value")
    for member, seat in summary.seats.items():
        reward = "-" if seat.reward is None else f"{seat.reward:+.3f} ± {seat.reward_ci95:.3f}"
        table.add_row(member, f"{seat.model}: reward {reward} (95% CI, n={seat.num_scored})")
        if seat.outcomes:
            table.add_row("", ", ".join(f"{name} {rate:.1%}" for name, rate in seat.outcomes.items()))
        table.add_row("", f"parse errors {seat.parse_error_rate:.1%} of turns, invalid moves "
                          f"{seat.invalid_moves:.2f} and forfeits {seat.forfeit_rate:.1%} per episode")
    errors = ", ".join(f"{k} {n}" for k, n in summary.errors_by_kind.items()) or "none"
    table.add_row("episodes", f"{summary.num_episodes} ({summary.num_ok} ok, {summary.errored_episodes} did not end "
                              f"normally, {summary.unscored_episodes} ended unscored)")
    table.add_row("errors", errors)
    table.add_row("failures", ", ".join(f"{k} {n}" for k, n in summary.failures.items()) or "none")
    table.add_row("stop reasons", ", ".join(f"{k} {n}" for k, n in summary.stop_reasons.items()) or "none")
    table.add_row("parse errors", f"{summary.parse_error_rate:.1%} of turns")
    table.add_row("forfeits", f"{summary.forfeit_rate:.1%} of episodes")
    if summary.wall_time is not None:
        table.add_row("wall time", f"{summary.wall_time:.1f}s")
    return table
