"""Advantages: group mean baseline, std normalisation, no-signal filtering, loading by import path, EMA state."""

import pytest

from tracegym.core.errors import UsageError
from tracegym.train.advantages import (
    DEFAULT_ADVANTAGE,
    EMABaseline,
    GroupAdvantages,
    group_mean,
    has_signal,
    load_advantage_fn,
)


def test_group_mean_subtracts_the_groups_mean():
    assert group_mean([1.0, 0.0, 0.5, 0.5]) == [0.5, -0.5, 0.0, 0.0]


def test_group_mean_with_std_divides_by_the_population_std():
    # mean 2, population std 1 for [1, 3, 1, 3]
    assert group_mean([1.0, 3.0, 1.0, 3.0], std=True, eps=0.0) == [-1.0, 1.0, -1.0, 1.0]


def test_group_mean_advantages_sum_to_zero():
    assert sum(group_mean([0.1, 0.7, 0.3])) == pytest.approx(0.0)


def test_a_group_of_equal_rewards_has_no_signal():
    assert not has_signal([0.4, 0.4, 0.4])
    assert has_signal([0.4, 0.4, 0.5])


def test_a_single_rollout_has_no_signal():
    assert not has_signal([1.0])


def test_groups_without_signal_are_filtered_and_counted():
    adv = GroupAdvantages(group_mean)
    assert adv([1.0, 1.0]) is None
    assert adv([0.0, 1.0]) == [-0.5, 0.5]
    assert adv([0.0, 0.0]) is None
    assert (adv.groups, adv.filtered) == (3, 2)


def test_filtering_can_be_turned_off():
    adv = GroupAdvantages(group_mean, filter_no_signal=False)
    assert adv([1.0, 1.0]) == [0.0, 0.0]
    assert adv.filtered == 0


def test_the_default_path_loads_group_mean_with_its_options():
    fn = load_advantage_fn(DEFAULT_ADVANTAGE, std=True, eps=0.0)
    assert fn([1.0, 3.0]) == [-1.0, 1.0]


def test_a_plain_function_by_import_path_is_called_without_key(tmp_path, monkeypatch):
    (tmp_path / "my_advantages.py").write_text("def best_gets_one(rewards):\n"
                                               "    return [1.0 if r == max(rewards) else 0.0 for r in rewards]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_advantage_fn("my_advantages:best_gets_one")
    assert GroupAdvantages(fn)([0.2, 0.9], key="task-1") == [0.0, 1.0]


def test_a_class_by_import_path_is_instantiated_with_options():
    fn = load_advantage_fn("tracegym.train.advantages:EMABaseline", decay=0.5)
    assert isinstance(fn, EMABaseline) and fn.decay == 0.5


@pytest.mark.parametrize("path", ["no_colon", "tracegym.train.advantages:missing", "no_such_module_xyz:f"])
def test_a_bad_import_path_is_a_usage_error(path):
    with pytest.raises(UsageError):
        load_advantage_fn(path)


def test_ema_baseline_starts_at_the_first_groups_mean_then_moves_slowly():
    ema = EMABaseline(decay=0.5)
    assert ema([0.0, 1.0], key="a") == [-0.5, 0.5]  # baseline 0.5, then 0.5*0.5 + 0.5*0.5 = 0.5
    assert ema([1.0, 1.0], key="a") == [0.5, 0.5]  # baseline 0.5, then 0.5*0.5 + 0.5*1.0 = 0.75
    assert ema([1.0], key="a") == [0.25]


def test_ema_baseline_keeps_one_baseline_per_key():
    ema = EMABaseline(decay=0.5)
    ema([0.0, 1.0], key="a")
    assert ema([2.0, 4.0], key="b") == [-1.0, 1.0]


def test_ema_state_round_trips_through_group_advantages_state():
    first = GroupAdvantages(EMABaseline(decay=0.8))
    first([0.0, 1.0], key="a")
    first([1.0, 1.0], key="a")
    second = GroupAdvantages(EMABaseline(decay=0.8))
    second.load_state_dict(first.state_dict())
    assert second([0.3, 0.9], key="a") == first([0.3, 0.9], key="a")
    assert (second.groups, second.filtered) == (first.groups, first.filtered)
