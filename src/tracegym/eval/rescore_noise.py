"""Rescore noise: how much a run's rewards move when the same traces are scored again, N times (a judge's or a
sampled reward's own variance, which a single score hides)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel

from tracegym.core.interval import mean_ci
from tracegym.core.trace import Trace

TOTAL = "reward"
"""The name the total (weighted) reward is reported under, beside each named reward."""


class RewardNoise(BaseModel):
    """One reward over N rescorings of the same traces."""

    repeats: int
    traces: int
    """Traces scored in every repeat (a score left None in any repeat leaves its trace out)."""
    changed: int
    """Traces whose score was not the same in every repeat."""
    within_std: float
    """The mean over traces of each trace's standard deviation across repeats: the noise of one score."""
    run_mean: float | None
    """The run's mean reward, averaged over the repeats."""
    run_mean_std: float
    """The standard deviation of the run's mean reward across repeats: the noise of the headline number."""
    run_mean_ci95: float
    """Half-width of the 95% interval of the run's mean reward from rescoring alone (over the repeats)."""


def reward_noise(repeats: Sequence[Sequence[Trace]]) -> dict[str, RewardNoise]:
    """Per reward name (and `TOTAL`): how the scores of `repeats` (repeat k's rescoring of trace i at [k][i], the
    same traces in the same order every time) vary."""
    names = sorted({name for traces in repeats for t in traces for name in t.rewards})
    return {name: _noise([[_score(t, name) for t in traces] for traces in repeats]) for name in [TOTAL, *names]}


def noise_lines(noise: dict[str, RewardNoise]) -> list[str]:
    """One line per reward, as the terminal shows them."""
    return [f"{name}: {n.changed} of {n.traces} traces changed across {n.repeats} rescorings; one score's std "
            f"{n.within_std:.4f}; run mean {_num(n.run_mean)} ± {n.run_mean_ci95:.4f} (95%, rescoring alone; std "
            f"{n.run_mean_std:.4f})" for name, n in noise.items()]


def _score(trace: Trace, name: str) -> float | None:
    if name == TOTAL:
        return trace.reward
    found = trace.rewards.get(name)
    return None if found is None else found.score


def _noise(scores: list[list[float | None]]) -> RewardNoise:
    """`scores[k][i]`: repeat k's score of trace i."""
    table = _complete(scores)
    per_trace = list(zip(*table, strict=True)) if table and table[0] else []
    estimate = mean_ci([statistics.fmean(row) for row in table if row])
    return RewardNoise(
        repeats=len(scores), traces=len(per_trace), changed=sum(len(set(v)) > 1 for v in per_trace),
        within_std=statistics.fmean(statistics.pstdev(v) for v in per_trace) if per_trace else 0.0,
        run_mean=estimate.mean, run_mean_std=estimate.std, run_mean_ci95=estimate.half_width)


def _complete(scores: list[list[float | None]]) -> list[list[float]]:
    """Each repeat's scores of the traces scored in every repeat."""
    kept = [i for i in range(len(scores[0]) if scores else 0) if all(row[i] is not None for row in scores)]
    return [[value for i in kept if (value := row[i]) is not None] for row in scores]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
