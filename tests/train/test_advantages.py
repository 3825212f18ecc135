"""Advantages: group mean baseline, std normalisation, no-signal filtering, loading by import path, EMA state, RAE,
and the [orchestrator.advantage] section."""

import pytest
from pydantic import ValidationError

from tracegym.core.errors import UsageError
from tracegym.train.advantages import (
    DEFAULT_ADVANTAGE,
    RAE,
    AdvantageConfig,
    EMABaseline,
    GroupAdvantages,
    baseline_key,
    build_advantages,
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


# --- RAE (SPIRAL, arXiv 2506.24119, Algorithm 1): the baseline is updated first, then subtracted ---------------
def test_rae_a_single_reward_of_one_gives_0_9():
    """Cold start b = 0; b <- 0.9 * 0 + 0.1 * 1.0 = 0.1; A = 1.0 - 0.1 = 0.9."""
    assert RAE(alpha=0.9)([1.0], key="k") == pytest.approx([0.9])


def test_rae_two_consecutive_rewards_of_one_on_one_key_give_0_9_then_0_81():
    """b = 0.1 -> A = 0.9; then b = 0.9 * 0.1 + 0.1 * 1.0 = 0.19 -> A = 0.81, within a group or across steps."""
    assert RAE(alpha=0.9)([1.0, 1.0], key="k") == pytest.approx([0.9, 0.81])
    rae = RAE(alpha=0.9)
    assert [rae([1.0], key="k")[0], rae([1.0], key="k")[0]] == pytest.approx([0.9, 0.81])
    assert rae.baselines == {"k": pytest.approx(0.19)}


def test_rae_keeps_one_baseline_per_key_and_defaults_to_alpha_0_9():
    rae = RAE()
    rae([1.0], key="kuhn/deal/player_0")
    assert rae([-1.0], key="kuhn/deal/player_1") == pytest.approx([-0.9])  # its own cold start
    assert rae.baselines == {"kuhn/deal/player_0": pytest.approx(0.1), "kuhn/deal/player_1": pytest.approx(-0.1)}


def test_rae_with_groups_of_one_is_never_filtered_by_the_configured_default():
    adv = build_advantages(AdvantageConfig(name="rae"))
    assert adv([1.0], key="k") == pytest.approx([0.9]) and adv.filtered == 0


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_rae_alpha_outside_0_1_is_refused(alpha):
    with pytest.raises(UsageError, match="alpha"):
        RAE(alpha=alpha)


def test_baseline_keys_name_taskset_task_and_member_and_leave_out_unset_parts():
    assert baseline_key("kuhn-poker", "abc", "player_0") == "kuhn-poker/abc/player_0"
    assert baseline_key("reverse-text", "abc") == "reverse-text/abc"
    assert baseline_key("", "abc") == "abc"


def test_a_stateful_advantage_resumed_from_a_state_without_its_own_is_a_loud_error():
    """E.g. a checkpoint of a group-mean run resumed with RAE: a silent cold start would change the run."""
    group_mean_state = GroupAdvantages(group_mean).state_dict()
    with pytest.raises(UsageError, match="no state of the advantage function"):
        GroupAdvantages(RAE()).load_state_dict(group_mean_state)


def test_rae_state_round_trips_through_group_advantages_state():
    first = build_advantages(AdvantageConfig(name="rae", alpha=0.8))
    first([1.0, -1.0], key="a")
    second = build_advantages(AdvantageConfig(name="rae", alpha=0.8))
    second.load_state_dict(first.state_dict())
    assert second([0.5], key="a") == first([0.5], key="a")


# --- the [orchestrator.advantage] section ---------------------------------------------------------------------
def test_the_default_section_is_group_mean_with_the_no_signal_filter():
    adv = build_advantages(AdvantageConfig())
    assert adv([1.0, 1.0]) is None and adv([0.0, 1.0]) == [-0.5, 0.5]


def test_the_section_passes_std_to_group_mean():
    assert build_advantages(AdvantageConfig(std=True))([1.0, 3.0]) == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_the_section_loads_your_own_function_with_its_options(tmp_path, monkeypatch):
    (tmp_path / "my_adv.py").write_text("def scaled(rewards, *, key='', by=1.0):\n"
                                        "    return [by * r for r in rewards]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    adv = build_advantages(AdvantageConfig(name="my_adv:scaled", options={"by": 2.0}, filter_no_signal=False))
    assert adv([1.0, 1.0], key="k") == [2.0, 2.0]


@pytest.mark.parametrize(("fields", "problem"), [
    ({"name": "nope"}, "unknown advantage 'nope'"),
    ({"name": "no_such_module_xyz:f"}, "cannot load advantage function"),
    ({"name": "rae", "alpha": 1.0}, "less than 1"),
    ({"name": "rae", "alpha": 0.0}, "greater than 0"),
    ({"name": "group_mean", "alpha": 0.5}, "alpha does not apply"),
    ({"name": "rae", "std": True}, "std does not apply"),
])
def test_a_bad_section_is_refused_at_load_time(fields, problem):
    with pytest.raises(ValidationError, match=problem):
        AdvantageConfig(**fields)


def test_the_section_with_every_field_written_out_loads_again():
    """The run folder's config.toml holds every field; a resume reads it back."""
    for config in (AdvantageConfig(), AdvantageConfig(name="rae", alpha=0.5)):
        assert AdvantageConfig.model_validate(config.model_dump()) == config
