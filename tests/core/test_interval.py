"""Interval: one estimate for every report (sample std, normal 95% half-width), and its doctest."""

import doctest
import math

import pytest

from tracegym.core import interval
from tracegym.core.interval import MeanCI, mean_ci


def test_no_values_have_no_mean_and_one_value_has_no_spread():
    assert mean_ci([]) == MeanCI(None, 0.0, 0.0, 0)
    assert mean_ci([0.25]) == MeanCI(0.25, 0.0, 0.0, 1)


def test_the_half_width_is_z_times_the_sample_std_over_root_n():
    estimate = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert estimate.mean == 2.5 and estimate.n == 4
    assert estimate.std == pytest.approx(math.sqrt(5 / 3))
    assert estimate.half_width == pytest.approx(interval.Z_95 * math.sqrt(5 / 3) / 2)


def test_the_module_example_runs():
    result = doctest.testmod(interval, optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed
