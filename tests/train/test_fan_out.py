"""Fan-out: each episode becomes one training unit per trainable member, with that member's own trace and exact
tokens; advantages are computed per (taskset, task, member), by whichever estimator the config names."""

import pytest

from tracegym.core.episode import SOLO, Episode
from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.messages import user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason
from tracegym.testing import make_episode, make_trace
from tracegym.train.advantages import RAE, GroupAdvantages, group_mean
from tracegym.train.fan_out import advantaged, by_key, episode_units
from tracegym.train.samples import trace_samples

DEAL = TaskData(prompt="deal 1")


def test_each_trainable_member_becomes_one_unit_with_its_own_trace_and_reward():
    episode = make_episode({"player_0": 1.0, "player_1": -1.0}, task=DEAL, taskset="kuhn-poker")
    units, dropped = episode_units([episode])
    assert [(u.member, u.reward) for u in units] == [("player_0", 1.0), ("player_1", -1.0)]
    assert [u.trace for u in units] == [episode.traces["player_0"], episode.traces["player_1"]]
    assert [u.key for u in units] == [f"kuhn-poker/{DEAL.key}/player_0", f"kuhn-poker/{DEAL.key}/player_1"]
    assert not dropped


def test_a_units_samples_are_its_members_exact_tokens():
    episode = make_episode({"player_0": 1.0, "player_1": -1.0})
    episode.traces["player_1"] = make_episode({"player_1": -1.0}).traces["player_1"]  # other tokens would show
    (unit,) = [u for u in episode_units([episode])[0] if u.member == "player_0"]
    (sample,) = trace_samples(unit.trace)
    assert sample.token_ids == [1, 2, 3, 7, 8] and sample.loss_mask == [False] * 3 + [True] * 2
    assert sample.trace_id == episode.traces["player_0"].id


def test_untrainable_members_make_no_unit():
    """A judge (untrainable unless the seat binding says so) and a pinned opponent are recorded untrainable."""
    episode = make_episode({"debater_a": 1.0, "debater_b": -1.0, "judge": 1.0},
                           trainable={"debater_a": True, "debater_b": False, "judge": False})
    assert [u.member for u in episode_units([episode])[0]] == ["debater_a"]


def test_baselines_can_be_kept_per_taskset_and_member_as_spiral_does():
    episodes = [make_episode({"p0": 1.0, "p1": -1.0}, task=TaskData(prompt=f"deal {i}"), taskset="kuhn")
                for i in range(2)]
    units, _ = episode_units(episodes, per_task=False)
    assert [u.key for u in units] == ["kuhn/p0", "kuhn/p1", "kuhn/p0", "kuhn/p1"]


def test_an_episode_that_ended_on_an_error_trains_nothing_and_is_counted():
    error = TraceError(kind=ErrorKind.TASK, stage="judge", message="verdict did not parse")
    episode = make_episode({"player_0": None, "player_1": None}, error=error)
    units, dropped = episode_units([episode])
    assert units == [] and dropped == {"episode_error": 2}


def test_a_member_without_a_reward_or_whose_trace_failed_is_left_out_and_counted():
    episode = make_episode({"player_0": 1.0, "player_1": None})
    failed = make_episode({"player_0": 1.0, "player_1": -1.0})
    failed.traces["player_1"].errors.append(TraceError(kind=ErrorKind.INFRASTRUCTURE, stage="model", message="down"))
    units, dropped = episode_units([episode, failed])
    assert [(u.member, u.reward) for u in units] == [("player_0", 1.0), ("player_0", 1.0)]
    assert dropped == {"scoring_error": 1, "model_unavailable": 1}  # unscored with no error recorded: scoring


def test_a_rollouts_solo_episode_is_one_unit_keyed_by_taskset_and_task_as_the_rollout_was():
    traces = [make_trace(reward=1.0, taskset="reverse-text"), make_trace(reward=None, taskset="reverse-text")]
    units, dropped = episode_units([Episode.solo(t) for t in traces], per_task=False)
    assert [(u.trace, u.member, u.reward, u.key) for u in units] == [
        (traces[0], SOLO, 1.0, f"reverse-text/{traces[0].task_key}")]
    assert dropped == {"scoring_error": 1}  # the trace's own failure, not `episode_error`


def test_a_failed_rollout_is_left_out_by_its_own_failure_kind():
    units, dropped = episode_units([Episode.solo(make_trace(error=ErrorKind.INFRASTRUCTURE))])
    assert units == [] and dropped == {"model_unavailable": 1}


def test_group_mean_over_solo_episodes_is_the_group_mean_over_their_rollouts():
    rewards = [1.0, 0.0, 0.25, None]
    units, _ = episode_units([Episode.solo(make_trace(reward=r)) for r in rewards])
    assert [a for _, a in advantaged(units, GroupAdvantages(group_mean))] == group_mean([1.0, 0.0, 0.25])


def test_a_rollout_cut_short_keeps_its_own_reward_whatever_the_truncated_reward():
    """`truncated_reward` is a multi-agent game's: a single-agent rollout is scored by its rewards."""
    trace = make_trace(reward=0.5, stop_reason=StopReason.TRUNCATED)
    assert [u.reward for u in episode_units([Episode.solo(trace)], truncated_reward=-1.0)[0]] == [0.5]


def test_a_scored_rollout_that_sampled_nothing_still_counts_in_its_group():
    """`no_turns` is a member's whose game ended before its turn; a rollout has no game around it."""
    trace = make_trace(reward=1.0)
    trace.graph = type(trace.graph)()
    trace.graph.add(user("question"))
    units, dropped = episode_units([Episode.solo(trace)])
    assert [u.trace for u in units] == [trace] and not dropped


def test_group_mean_compares_each_member_with_itself_across_the_groups_episodes():
    """Seat 0 won twice and lost once; seat 1 the reverse: each seat's advantages are its own rewards minus its
    own mean, never mixed with the other seat's."""
    episodes = [make_episode({"p0": r, "p1": -r}) for r in (1.0, 1.0, -1.0)]
    units, _ = episode_units(episodes)
    result = {(u.member, i): a for i, (u, a) in enumerate(advantaged(units, GroupAdvantages(group_mean)))}
    assert [round(a, 6) for a in result.values()] == [0.666667, 0.666667, -1.333333, -0.666667, -0.666667, 1.333333]
    assert [m for m, _ in result] == ["p0", "p0", "p0", "p1", "p1", "p1"]


def test_rae_over_fanned_out_episodes_keeps_one_baseline_per_member_with_groups_of_one():
    rae = RAE(alpha=0.9)
    adv = GroupAdvantages(rae, filter_no_signal=False)
    for _ in range(2):  # two steps, one episode each (group size 1): seat 0 wins both
        units, _ = episode_units([make_episode({"p0": 1.0, "p1": -1.0}, task=DEAL, taskset="kuhn")])
        values = [a for _, a in advantaged(units, adv)]
    assert values == pytest.approx([0.81, -0.81])
    assert rae.baselines == {f"kuhn/{DEAL.key}/p0": pytest.approx(0.19), f"kuhn/{DEAL.key}/p1": pytest.approx(-0.19)}


def test_units_are_grouped_per_key_in_the_order_keys_first_appear():
    units, _ = episode_units([make_episode({"a": 1.0, "b": 0.0}), make_episode({"a": 0.0, "b": 1.0})])
    assert [[u.member for u in group] for group in by_key(units)] == [["a", "a"], ["b", "b"]]


def test_a_member_whose_turn_never_came_makes_no_unit():
    """player_0 forfeited before player_1 acted: player_1 won without a sampled token, so there is nothing to
    train (not an invalid trace)."""
    episode = make_episode({"player_0": -1.0, "player_1": 1.0})
    late = episode.traces["player_1"]
    late.graph = type(late.graph)()
    late.graph.add(user("you are player_1"))
    units, dropped = episode_units([episode])
    assert [u.member for u in units] == ["player_0"] and dropped == {"no_turns": 1}


def test_an_episode_cut_short_can_pay_its_trainable_members_a_set_reward():
    """A reply ran into the completion budget: the unfinished hand pays 0, unless training says otherwise."""
    episode = make_episode({"p0": 0.0, "p1": 0.0}, stop_reason=StopReason.TRUNCATED)
    assert [u.reward for u in episode_units([episode])[0]] == [0.0, 0.0]
    assert [u.reward for u in episode_units([episode], truncated_reward=-1.0)[0]] == [-1.0, -1.0]
    finished = make_episode({"p0": 1.0, "p1": -1.0})
    assert [u.reward for u in episode_units([finished], truncated_reward=-1.0)[0]] == [1.0, -1.0]
