"""Combined summary: the figures of a run of several tasksets, one row per taskset (its run folder's own summary
in short) and the whole run's, as written to the combined run folder's `summary.json` and shown as one table."""

from __future__ import annotations

from pydantic import BaseModel, Field
from rich.table import Table

from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.run_summary import failed
from tracegym.eval.summary import Summary


class TasksetRow(BaseModel):
    """One taskset of a combined run: where its run folder is and what its summary says, in short."""

    name: str
    """Its run folder's name inside the combined one."""
    taskset: str
    """The taskset id."""
    unit: str = "rollouts"
    """What `total` and `failed` count: `rollouts`, or `episodes` for a multi-agent taskset."""
    total: int = 0
    failed: int = 0
    """Of `total`, those that failed (errored, never finished or left a reward unscored)."""
    reward: float | None = None
    """Mean total reward over its scored rollouts; None when none is scored, or for a multi-agent taskset (its
    summary has one per seat)."""
    reward_ci95: float = 0.0
    pass_at_1: float | None = None
    wall_time: float | None = None


class CombinedSummary(BaseModel):
    """The whole of a combined run: each taskset's row, in the run's order, and the sums over them."""

    tasksets: list[TasksetRow] = Field(default_factory=list)
    not_run: list[str] = Field(default_factory=list)
    """Tasksets whose run has not started yet (a run stopped before them: `--resume` runs them)."""
    reward: float | None = None
    """Mean over the tasksets of each one's mean reward (each taskset counts once, whatever its size); None when
    no taskset has one."""
    total: int = 0
    """Rollouts (and multi-agent episodes) of every taskset."""
    failed: int = 0
    wall_time: float = 0.0
    """Seconds of every taskset's run, added up."""


def taskset_row(name: str, taskset: str, summary: Summary | EpisodeSummary) -> TasksetRow:
    """One taskset's row from its run's summary."""
    bad, total = failed(summary)
    if isinstance(summary, EpisodeSummary):
        return TasksetRow(name=name, taskset=taskset, unit="episodes", total=total, failed=bad,
                          wall_time=summary.wall_time)
    return TasksetRow(name=name, taskset=taskset, total=total, failed=bad, reward=summary.reward,
                      reward_ci95=summary.reward_ci95, pass_at_1=summary.pass_at_k.get(1),
                      wall_time=summary.wall_time)


def combine(rows: list[TasksetRow], not_run: list[str]) -> CombinedSummary:
    """The combined summary of these rows."""
    rewards = [r.reward for r in rows if r.reward is not None]
    return CombinedSummary(tasksets=rows, not_run=not_run, reward=sum(rewards) / len(rewards) if rewards else None,
                           total=sum(r.total for r in rows), failed=sum(r.failed for r in rows),
                           wall_time=sum(r.wall_time or 0.0 for r in rows))


def combined_table(summary: CombinedSummary, title: str = "") -> Table:
    """The combined summary as the terminal shows it: a row per taskset, then the whole run's."""
    table = Table(title=title or None)
    for column in ("taskset", "reward", "pass@1", "failed", "wall s"):
        table.add_column(column, justify="left" if column == "taskset" else "right")
    for row in summary.tasksets:
        table.add_row(row.name, _mean(row.reward, row.reward_ci95), _num(row.pass_at_1),
                      f"{row.failed}/{row.total} {row.unit}", _num(row.wall_time, 1))
    for name in summary.not_run:
        table.add_row(name, "not run", "", "", "")
    table.add_row("all (mean of tasksets)", _num(summary.reward), "", f"{summary.failed}/{summary.total}",
                  _num(summary.wall_time, 1), style="bold")
    return table


def _mean(value: float | None, ci95: float) -> str:
    return "-" if value is None else f"{value:.3f} ± {ci95:.3f}"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
