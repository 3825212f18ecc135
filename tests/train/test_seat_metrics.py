"""Seat metrics: per-member reward, win/draw/loss/forfeit rates, parse errors and advantages, and the learner's."""

import pytest

from tracegym.core.episode import Outcome
from tracegym.testing import make_episode
from tracegym.train.advantages import GroupAdvantages, group_mean
from tracegym.train.fan_out import advantaged, episode_units
from tracegym.train.seat_metrics import seat_metrics


def test_each_seat_gets_its_reward_rates_parse_errors_and_advantages():
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}), make_episode({"p0": 1.0, "p1": -1.0}),
                make_episode({"p0": 0.0, "p1": 0.0}),
                make_episode({"p0": 1.0, "p1": -1.0}, outcomes={"p0": Outcome.WIN, "p1": Outcome.FORFEIT},
                             member_metrics={"p1": {"parse_errors": 3.0}})]
    units, _ = episode_units(episodes)
    metrics = seat_metrics(episodes, advantaged(units, GroupAdvantages(group_mean)))
    assert metrics["seat/p0/reward"] == 0.75 and metrics["seat/p1/reward"] == -0.75
    assert metrics["seat/p0/win_rate"] == 0.75 and metrics["seat/p0/draw_rate"] == 0.25
    assert metrics["seat/p1/loss_rate"] == 0.5 and metrics["seat/p1/forfeit_rate"] == 0.25
    assert metrics["seat/p1/parse_errors"] == 3 and metrics["seat/p0/parse_errors"] == 0
    assert metrics["seat/p0/advantage_mean"] == pytest.approx(0.0)
    assert metrics["seat/p0/advantage_std"] == pytest.approx(0.4330127)  # [0.25, 0.25, -0.75, 0.25]
    assert metrics["seat/p0/episodes"] == 4


def test_the_learner_is_followed_across_seats():
    """The learner sits in p0 in the first episode and in p1 in the second, winning both."""
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}, trainable={"p0": True, "p1": False}),
                make_episode({"p0": -1.0, "p1": 1.0}, trainable={"p0": False, "p1": True})]
    units, _ = episode_units(episodes)
    metrics = seat_metrics(episodes, advantaged(units, GroupAdvantages(group_mean, filter_no_signal=False)))
    assert metrics["learner/win_rate"] == 1.0 and metrics["learner/reward"] == 1.0
    assert metrics["seat/p0/win_rate"] == 0.5 and metrics["learner/episodes"] == 2


def test_a_seat_without_decided_rewards_or_outcomes_reports_only_counts():
    episode = make_episode({"p0": None, "p1": None})
    metrics = seat_metrics([episode], [])
    assert metrics == {"seat/p0/episodes": 1, "seat/p0/parse_errors": 0, "seat/p1/episodes": 1,
                       "seat/p1/parse_errors": 0, "learner/episodes": 2, "learner/parse_errors": 0}
