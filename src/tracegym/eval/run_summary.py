"""Run summary: what a run's episodes add up to: a single-agent run's (every episode solo) is the `Summary` of its
traces, a multi-agent run's the per-seat `EpisodeSummary`; `tracegym eval`, `show` and `rescore` all decide here."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from tracegym.core.cut_policy import KEEP, CutPolicy
from tracegym.core.episode import Episode
from tracegym.core.error_rate import failed_share
from tracegym.eval.episode_summary import EpisodeSummary, episode_table, summarize_episodes
from tracegym.eval.summary import Summary, summarize, summary_table


def summarize_run(episodes: Sequence[Episode], *, pass_threshold: float = 1.0,
                  wall_time: float | None = None, cuts: CutPolicy = KEEP) -> Summary | EpisodeSummary:
    """The summary of a run's episodes: of their traces when every one is solo (pass@k over `pass_threshold`, cut
    rollouts' rewards as `cuts` has them), else per seat."""
    if all(e.is_solo for e in episodes):
        traces = [t for e in episodes for t in e.traces.values()]
        return summarize(traces, pass_threshold=pass_threshold, wall_time=wall_time, cuts=cuts)
    return summarize_episodes(episodes, wall_time=wall_time)


def failed(summary: Summary | EpisodeSummary) -> tuple[int, int]:
    """How many of the run's rollouts failed (`Trace.failure`: errored, unfinished or left unscored), and of how
    many; of a multi-agent run, its episodes that did not end normally with every reward decided."""
    if isinstance(summary, EpisodeSummary):
        return summary.num_episodes - summary.num_ok, summary.num_episodes
    return sum(summary.failures.values()), summary.num_traces


def too_many_failed(summary: Summary | EpisodeSummary, max_error_rate: float) -> str | None:
    """One line saying the run failed when more than `max_error_rate` of it failed; None when it did not."""
    bad, total = failed(summary)
    unit = "episodes" if isinstance(summary, EpisodeSummary) else "rollouts"
    too_many = failed_share(bad, total, unit, max_error_rate)
    if too_many is None:
        return None
    return f"{too_many}: the figures above are of the {total - bad} others; the summary's failures say what went wrong"


def run_table(summary: Summary | EpisodeSummary, title: str = "") -> Table:
    """The summary's table, as the terminal shows it."""
    if isinstance(summary, EpisodeSummary):
        return episode_table(summary, title=title)
    return summary_table(summary, title=title)
