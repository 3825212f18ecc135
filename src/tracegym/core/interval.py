"""Interval: the mean of a set of values with the half-width of its 95% confidence interval.

The one estimate every report uses (eval summaries, pass@k, an RL step's reward, its held-out figures), so the same
numbers mean the same thing everywhere: the sample standard deviation (n - 1) and the normal approximation.

>>> mean_ci([1.0, 0.0, 1.0, 0.0])
MeanCI(mean=0.5, half_width=0.565..., std=0.577..., n=4)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

Z_95 = 1.96
"""Normal quantile for a two-sided 95% confidence interval."""


class MeanCI(NamedTuple):
    """A mean (None without values), its 95% half-width and sample std (0 below two values), and the count."""

    mean: float | None
    half_width: float
    std: float
    n: int


def mean_ci(values: Sequence[float]) -> MeanCI:
    """The mean of `values` with a 95% interval of `Z_95 * std / sqrt(n)`."""
    n = len(values)
    if n == 0:
        return MeanCI(None, 0.0, 0.0, 0)
    if n == 1:
        return MeanCI(float(values[0]), 0.0, 0.0, 1)
    std = statistics.stdev(values)
    return MeanCI(statistics.fmean(values), Z_95 * std / math.sqrt(n), std, n)
