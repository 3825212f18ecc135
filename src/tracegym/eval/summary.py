"""Summary: the aggregate numbers of a set of traces (reward with CI, pass@k, avg@k, errors, tokens, throughput)."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from fractions import Fraction

from pydantic import BaseModel, Field
from rich.table import Table

from tracegym.core.cut_policy import KEEP, MASKED, CutPolicy
from tracegym.core.errors import ErrorKind
from tracegym.core.interval import MeanCI, mean_ci
from tracegym.core.trace import Trace


class Stat(BaseModel):
    """The mean of one named reward or metric over the traces where it is set."""

    mean: float | None = None
    """Mean over the traces where the value is not None; None when no trace has it set."""
    count: int = 0
    """How many traces have the value set (not None)."""


class Summary(BaseModel):
    """Aggregate numbers of a set of traces, as written to a run folder's `summary.json`."""

    num_traces: int = 0
    """Every trace given, scored or not."""
    num_scored: int = 0
    """Traces whose total reward counts: set, and not masked by the cut policy (the rest errored, went unscored or
    were masked, and are left out of every mean)."""
    num_tasks: int = 0
    """Distinct task keys."""
    rollouts_per_task: int = 0
    """The most traces any one task key has."""
    pass_threshold: float = 1.0
    """A scored trace passes when its total reward is at least this."""
    reward: float | None = None
    """Mean total reward over the scored traces; None when none is scored."""
    reward_std: float = 0.0
    """Sample standard deviation (n - 1) of the scored total rewards; 0 below two."""
    reward_ci95: float = 0.0
    """Half-width of the 95% confidence interval of `reward`: 1.96 * std / sqrt(n); 0 below two."""
    rewards: dict[str, Stat] = Field(default_factory=dict)
    """Each reward function's score, by name."""
    metrics: dict[str, Stat] = Field(default_factory=dict)
    """Each metric, by name."""
    tasks_at_k: dict[int, int] = Field(default_factory=dict)
    """For k = 1..rollouts_per_task, how many tasks have at least k scored rollouts: the tasks behind pass@k and
    avg@k (a task with errored rollouts may count for small k only)."""
    pass_at_k: dict[int, float | None] = Field(default_factory=dict)
    """Unbiased pass@k of each task from all its scored rollouts, averaged over the `tasks_at_k` tasks; None
    where no task has k scored rollouts."""
    pass_at_k_ci95: dict[int, float] = Field(default_factory=dict)
    """Half-width of the 95% confidence interval of `pass_at_k` over those tasks; 0 below two tasks."""
    avg_at_k: dict[int, float | None] = Field(default_factory=dict)
    """Mean reward of each task over all its scored rollouts, averaged over the `tasks_at_k` tasks (on a 0/1
    reward avg@1 equals pass@1); None where no task has k scored rollouts."""
    avg_at_k_ci95: dict[int, float] = Field(default_factory=dict)
    """Half-width of the 95% confidence interval of `avg_at_k` over those tasks; 0 below two tasks."""
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    """For every error kind, how many traces recorded at least one error of it."""
    failures: dict[str, int] = Field(default_factory=dict)
    """How many traces failed (`Trace.failure`: left out of training), by failure kind; only kinds that occurred."""
    errored_traces: int = 0
    """Traces that did not end normally (an error, a timeout, a cancel, or no end recorded): the ones a resume
    runs again."""
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    """How many traces ended for each reason (`none`: no stop reason recorded)."""
    truncation_rate: float = 0.0
    """Fraction of traces that ran out of context or completion budget."""
    cuts: dict[str, int] = Field(default_factory=dict)
    """How many traces were cut short or misread, by kind (`Trace.cut`: overlong, length, unparsable)."""
    masked: int = 0
    """Scored traces the cut policy (`--cuts`) left out of every mean."""
    prompt_tokens: int = 0
    """Prompt tokens reported by the endpoint, summed over every trace."""
    completion_tokens: int = 0
    """Completion tokens reported by the endpoint, summed over every trace."""
    mean_completion_tokens: float = 0.0
    """Completion tokens per trace."""
    wall_time: float | None = None
    """Seconds the run took (all its sessions, for a resumed run), when the caller measured it."""
    rollouts_per_second: float | None = None
    """Traces per second of wall time, when wall time is known and positive."""


def summarize(traces: Sequence[Trace], *, pass_threshold: float = 1.0, wall_time: float | None = None,
              cuts: CutPolicy = KEEP) -> Summary:
    """Aggregate traces into a Summary. Every trace given counts; pass one trace per (task key, rollout index).
    A cut trace's reward counts as the `cuts` policy has it (kept by default, replaced, or masked out)."""
    counts = Counter(t.task_key for t in traces)
    k_max = max(counts.values(), default=0)
    counted = [counted_reward(t, cuts) for t in traces]
    scored = _scored_by_task(zip(traces, counted, strict=True))
    reward = mean_ci([r for r in counted if r is not None])
    at_k = {k: _at_k(scored, k, pass_threshold) for k in range(1, k_max + 1)}
    n = len(traces)
    completion = sum(t.usage.completion_tokens for t in traces)
    return Summary(
        num_traces=n,
        num_scored=reward.n,
        num_tasks=len(counts),
        rollouts_per_task=k_max,
        pass_threshold=pass_threshold,
        reward=reward.mean,
        reward_std=reward.std,
        reward_ci95=reward.half_width,
        rewards=_stats((name, r.score) for t in traces for name, r in t.rewards.items()),
        metrics=_stats(item for t in traces for item in t.metrics.items()),
        tasks_at_k={k: passes.n for k, (passes, _) in at_k.items()},
        pass_at_k={k: passes.mean for k, (passes, _) in at_k.items()},
        pass_at_k_ci95={k: passes.half_width for k, (passes, _) in at_k.items()},
        avg_at_k={k: avgs.mean for k, (_, avgs) in at_k.items()},
        avg_at_k_ci95={k: avgs.half_width for k, (_, avgs) in at_k.items()},
        errors_by_kind={kind.value: sum(1 for t in traces if t.has_error(kind)) for kind in ErrorKind},
        failures=dict(sorted(Counter(f.value for t in traces if (f := t.failure) is not None).items())),
        errored_traces=sum(1 for t in traces if not t.ended_normally),
        stop_reasons=dict(Counter(t.stop_reason.value if t.stop_reason else "none" for t in traces)),
        truncation_rate=sum(t.is_truncated for t in traces) / n if n else 0.0,
        cuts=dict(sorted(Counter(c.value for t in traces if (c := t.cut) is not None).items())),
        masked=sum(1 for t, r in zip(traces, counted, strict=True) if t.reward is not None and r is None),
        prompt_tokens=sum(t.usage.prompt_tokens for t in traces),
        completion_tokens=completion,
        mean_completion_tokens=completion / n if n else 0.0,
        wall_time=wall_time,
        rollouts_per_second=n / wall_time if wall_time is not None and wall_time > 0 else None,
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n samples, c of them passing: 1 - C(n-c, k) / C(n, k), computed exactly
    and rounded once, so pass@1 is c / n to the last bit (the mean of a 0/1 reward)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (got n={n}, c={c}, k={k})")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def counted_reward(trace: Trace, cuts: CutPolicy) -> float | None:
    """The reward a trace counts with in the summary: its total reward as the cut policy has it for its cut; None
    when it is unscored or masked."""
    reward = trace.reward
    if reward is None:
        return None
    counted = cuts.reward(trace.cut, reward)
    return None if counted == MASKED else float(counted)


def _scored_by_task(counted: Iterable[tuple[Trace, float | None]]) -> dict[str, list[float]]:
    """Each task key's counted total rewards, from (trace, its counted reward)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for trace, reward in counted:
        if reward is not None:
            by_task[trace.task_key].append(reward)
    return by_task


def _at_k(scored: dict[str, list[float]], k: int, threshold: float) -> tuple[MeanCI, MeanCI]:
    """pass@k and avg@k over the tasks with at least k scored rollouts, each task's from all its scored rollouts."""
    tasks = [rewards for rewards in scored.values() if len(rewards) >= k]
    passes = [pass_at_k(len(rewards), sum(r >= threshold for r in rewards), k) for rewards in tasks]
    return mean_ci(passes), mean_ci([statistics.fmean(rewards) for rewards in tasks])


def _stats(items: Iterable[tuple[str, float | None]]) -> dict[str, Stat]:
    """Mean and count per name, over the values that are set; names in first-seen order."""
    values: dict[str, list[float]] = {}
    for name, value in items:
        values.setdefault(name, [])
        if value is not None:
            values[name].append(value)
    return {name: Stat(mean=statistics.fmean(vs) if vs else None, count=len(vs)) for name, vs in values.items()}


def summary_table(summary: Summary, title: str = "") -> Table:
    """The summary as a two-column rich table."""
    table = Table(title=title or None, show_header=False)
    table.add_column("name", style="bold")
    table.add_column("value")
    for name, value in _rows(summary):
        table.add_row(name, value)
    return table


def summary_lines(summary: Summary) -> list[str]:
    """The summary as plain `name: value` lines."""
    return [f"{name}: {value}" for name, value in _rows(summary)]


def _rows(s: Summary) -> list[tuple[str, str]]:
    """The (name, value) rows shared by the table and the plain lines."""
    rows = [
        ("traces", f"{s.num_traces} ({s.num_scored} scored)"),
        ("tasks", f"{s.num_tasks} (up to {s.rollouts_per_task} rollouts each)"),
        ("reward", _reward_text(s)),
    ]
    rows += [(f"reward/{name}", _stat_text(stat)) for name, stat in s.rewards.items()]
    rows += [(f"metric/{name}", _stat_text(stat)) for name, stat in s.metrics.items()]
    if s.pass_at_k:
        rows.append(("pass threshold", f"reward >= {s.pass_threshold:g}"))
    rows += [(f"pass@{k} / avg@{k}", _at_k_text(s, k)) for k in s.pass_at_k]
    rows += [
        ("errors", _counts_text(s.errors_by_kind)),
        ("failures", _counts_text(s.failures)),
        ("did not end normally", str(s.errored_traces)),
        ("stop reasons", _counts_text(s.stop_reasons)),
        ("truncated", f"{s.truncation_rate:.1%}"),
        ("cut", _counts_text(s.cuts) + (f" ({s.masked} masked)" if s.masked else "")),
        ("tokens", f"{s.prompt_tokens:,} prompt, {s.completion_tokens:,} completion"),
        ("completion tokens / trace", f"{s.mean_completion_tokens:.1f}"),
    ]
    if s.wall_time is not None:
        rate = f" ({s.rollouts_per_second:.2f} rollouts/s)" if s.rollouts_per_second is not None else ""
        rows.append(("wall time", f"{s.wall_time:.1f}s{rate}"))
    return rows


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _reward_text(s: Summary) -> str:
    if s.reward is None:
        return "-"
    scored = f"n={s.num_scored}" if s.num_scored == s.num_traces else f"{s.num_scored} of {s.num_traces} scored"
    return f"{s.reward:.3f} ± {s.reward_ci95:.3f} (95% CI, std {s.reward_std:.3f}, {scored})"


def _at_k_text(s: Summary, k: int) -> str:
    """`pass ± ci / avg ± ci (n tasks)`; the intervals are over tasks."""
    tasks = s.tasks_at_k.get(k, 0)
    return (f"{_interval(s.pass_at_k[k], s.pass_at_k_ci95.get(k, 0.0))} / "
            f"{_interval(s.avg_at_k.get(k), s.avg_at_k_ci95.get(k, 0.0))} ({tasks} task{'' if tasks == 1 else 's'})")


def _interval(value: float | None, ci95: float) -> str:
    return "-" if value is None else f"{value:.3f} ± {ci95:.3f}"


def _stat_text(stat: Stat) -> str:
    return f"{_num(stat.mean)} (n={stat.count})"


def _counts_text(counts: dict[str, int]) -> str:
    """`a 3, b 1` for the non-zero counts, largest first; `none` when all are zero."""
    items = sorted(((name, n) for name, n in counts.items() if n), key=lambda item: -item[1])
    return ", ".join(f"{name} {n}" for name, n in items) or "none"
