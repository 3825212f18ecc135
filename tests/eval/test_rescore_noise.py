"""Rescore noise: per reward and for the total, what changed across repeats, one score's noise and the run mean's."""

import pytest

from tracegym.core.trace import RewardScore
from tracegym.eval.rescore_noise import reward_noise
from tracegym.testing import make_trace


def scored(**scores: float | None):
    trace = make_trace("t")
    trace.rewards = {name: RewardScore(score=s) for name, s in scores.items()}
    return trace


def test_a_score_that_flips_between_two_values_has_half_its_gap_as_std():
    noise = reward_noise([[scored(j=0.0)], [scored(j=1.0)]])["j"]
    assert (noise.changed, noise.within_std, noise.run_mean) == (1, 0.5, 0.5)


def test_the_run_mean_interval_comes_from_the_spread_of_the_repeats_means():
    repeats = [[scored(j=a), scored(j=b)] for a, b in [(0.0, 1.0), (1.0, 1.0), (0.0, 0.0)]]
    noise = reward_noise(repeats)["j"]
    assert noise.run_mean == pytest.approx(0.5) and noise.run_mean_std == pytest.approx(0.5)
    assert noise.run_mean_ci95 == pytest.approx(1.96 * 0.5 / 3 ** 0.5, rel=1e-3)


def test_a_trace_unscored_in_any_repeat_is_left_out():
    noise = reward_noise([[scored(j=1.0), scored(j=None)], [scored(j=1.0), scored(j=0.0)]])["j"]
    assert (noise.traces, noise.changed, noise.run_mean) == (1, 0, 1.0)
