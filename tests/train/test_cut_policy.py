"""RL's cut policy (`[orchestrator.cuts]`): an overlong, a length-truncated and an unparsable rollout each count
with their own rule: their scored reward (`keep`, the default), a number in its place, or masked out of their
group's baseline and the loss (counted as `masked/<kind>`)."""

import asyncio
import doctest

from tracegym.cli.main import main
from tracegym.core import cut_policy
from tracegym.core.cut_policy import CutPolicy
from tracegym.core.episode import Episode
from tracegym.core.errors import ContextLengthError, classify
from tracegym.core.messages import assistant
from tracegym.core.trace import Cut, StopReason, Trace
from tracegym.testing import make_episode, tool_call
from tracegym.testing.episodes import member_trace
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.fan_out import episode_units
from tracegym.train.orchestrator import step_metrics
from tracegym.train.signal import RLSignal, StepGroups


def rollout(reward: float, cut: Cut | None = None) -> Trace:
    """A trainable rollout with one sampled turn, cut as `cut` says."""
    trace = member_trace("solo", reward, task=make_episode({"p": 0.0}).task, taskset="t", episode_id="e")
    trace.member = trace.episode_id = None
    if cut in (Cut.LENGTH, Cut.OVERLONG):
        trace.stop_reason = StopReason.TRUNCATED
    if cut == Cut.OVERLONG:
        trace.errors.append(classify(ContextLengthError("prompt of 70412 tokens"), "model"))
    if cut == Cut.UNPARSABLE:
        trace.graph.add_model_turn(assistant(None, [tool_call("add", "{oops")]), prompt_ids=[1, 2, 3, 7, 8],
                                   completion_ids=[9], completion_logprobs=[-0.5], temperature=1.0)
    assert trace.cut == cut
    return trace


GROUP = [rollout(1.0), rollout(0.0), rollout(0.5, Cut.LENGTH), rollout(0.5, Cut.OVERLONG),
         rollout(0.5, Cut.UNPARSABLE)]


def rewards(policy: CutPolicy) -> list[float]:
    units, _ = episode_units([Episode.solo(t) for t in GROUP], cuts=policy)
    return [u.reward for u in units]


def test_the_modules_doctest_runs():
    assert doctest.testmod(cut_policy).failed == 0


def test_by_default_every_cut_rollout_keeps_its_scored_reward():
    assert rewards(CutPolicy()) == [1.0, 0.0, 0.5, 0.5, 0.5]


def test_each_cut_kind_has_its_own_reward():
    assert rewards(CutPolicy(length=-1.0, overlong=-2.0, unparsable=0.0)) == [1.0, 0.0, -1.0, -2.0, 0.0]


def test_a_masked_cut_is_out_of_the_group_and_counted_by_kind():
    units, dropped = episode_units([Episode.solo(t) for t in GROUP], cuts=CutPolicy(overlong="mask"))
    assert [u.trace for u in units] == [GROUP[0], GROUP[1], GROUP[2], GROUP[4]]
    assert dropped == {"masked/overlong": 1}


def test_a_masked_rollout_is_neither_in_the_baseline_nor_trained_and_the_step_counts_it():
    signal = RLSignal(GroupAdvantages(), cuts=CutPolicy(length="mask", unparsable="mask"))
    samples, figures = asyncio.run(signal.samples(StepGroups(0, [[Episode.solo(t) for t in GROUP]]), version=0))
    assert {s.trace_id: s.advantage for s in samples} == {GROUP[0].id: 0.5, GROUP[1].id: -0.5, GROUP[3].id: 0.0}
    assert (figures["masked/length"], figures["masked/unparsable"]) == (1, 1)


def test_a_multi_agent_members_own_cut_takes_its_rule():
    episode = make_episode({"p0": 1.0, "p1": -1.0})
    episode.traces["p1"].stop_reason = StopReason.TRUNCATED
    units, _ = episode_units([episode], cuts=CutPolicy(length=-3.0))
    assert [(u.member, u.reward) for u in units] == [("p0", 1.0), ("p1", -3.0)]


def test_truncated_reward_decides_a_multi_agent_episode_cut_short_as_a_whole():
    episode = make_episode({"p0": 1.0, "p1": -1.0}, stop_reason=StopReason.TRUNCATED)
    units, _ = episode_units([episode], truncated_reward=-1.0, cuts=CutPolicy(length="mask"))
    assert [u.reward for u in units] == [-1.0, -1.0]


def test_the_step_counts_its_rollouts_by_cut():
    metrics = step_metrics([GROUP], [], 1.0)
    assert (metrics["cut/length"], metrics["cut/overlong"], metrics["cut/unparsable"]) == (1, 1, 1)


def test_cuts_are_set_from_the_rl_command_line(tmp_path, capsys):
    flags = ["--orchestrator.cuts.length", "-1", "--orchestrator.cuts.overlong", "mask"]
    assert main(["rl", *flags, "--dry-run", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[run.orchestrator.cuts]" in out and 'overlong = "mask"' in out and "length = -1.0" in out


def test_a_cut_rule_that_is_neither_keep_mask_nor_a_number_exits_2_naming_the_flag(capsys):
    assert main(["rl", "--orchestrator.cuts.length", "drop", "--dry-run"]) == 2
    assert "--orchestrator.cuts.length" in capsys.readouterr().err
