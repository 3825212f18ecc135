"""Group rewards in process: `@reward(group=True)` scores a task's rollouts together, once each is scored alone."""

import asyncio

import pytest

import tracegym as tg
from tracegym.core.errors import FailureKind
from tracegym.envs.evaluate import evaluate_iter
from tracegym.tasksets.debate import Debate, DebateTask
from tracegym.testing import Fail, ScriptedModel

SEEDED = tg.Sampling(seed=0)
"""Rollout i samples with seed i, so a scripted rule can tell the rollouts apart."""


@tg.reward
def length(task, trace):
    return float(len(trace.last_reply))


@tg.reward(group=True, weight=2.0)
def longest(task, traces):
    """1 for the rollouts whose reply is the group's longest (by their own `length` reward), else 0."""
    best = max(t.rewards["length"].score for t in traces)
    return [float(t.rewards["length"].score == best) for t in traces]


def reply_by_seed(*replies):
    return lambda request: replies[request.sampling.seed]


def taskset(*rewards, metrics=()):
    return tg.Taskset(id="grouped", data=[{"prompt": "q"}, {"prompt": "r"}], rewards=list(rewards),
                      metrics=list(metrics))


async def test_a_group_reward_scores_each_rollout_against_its_group_after_each_is_scored_alone():
    ts = taskset(length, longest)
    traces = await tg.run_group(ts, ts[0], ScriptedModel(rule=reply_by_seed("ab", "abcd", "abc")), rollouts=3,
                                sampling=SEEDED)
    assert [t.rewards["longest"].score for t in traces] == [0.0, 1.0, 0.0]
    assert [t.reward for t in traces] == [2.0, 6.0, 3.0]  # length + 2 x longest
    assert all(t.ok for t in traces)


async def test_a_rollout_outside_any_group_leaves_its_group_reward_none_not_zero():
    ts = taskset(length, longest)
    trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["abc"]))
    assert trace.rewards["longest"].score is None and trace.reward is None
    assert trace.failure == FailureKind.SCORING_ERROR


async def test_a_failed_rollout_is_left_out_of_its_group_and_the_others_are_scored_among_themselves():
    def rule(request):
        return Fail(400, "bad") if request.sampling.seed == 1 else ("ab", "", "abc")[request.sampling.seed]

    seen = []

    @tg.reward(group=True)
    def counted(task, traces):
        seen.append([t.rollout_index for t in traces])
        return [1.0] * len(traces)

    ts = taskset(counted)
    traces = await tg.run_group(ts, ts[0], ScriptedModel(rule=rule), rollouts=3, sampling=SEEDED)
    assert seen == [[0, 2]]
    assert traces[1].rewards["counted"].score is None and traces[1].errors[0].kind == tg.ErrorKind.MODEL
    assert traces[0].rewards["counted"].score == traces[2].rewards["counted"].score == 1.0


async def test_a_group_reward_that_raises_leaves_each_score_none_with_its_error_on_every_trace():
    @tg.reward(group=True)
    def broken(task, traces):
        raise ValueError("no comparison")

    ts = taskset(length, broken)
    traces = await tg.run_group(ts, ts[0], ScriptedModel(["a", "b"]), rollouts=2)
    for trace in traces:
        assert trace.rewards["broken"].score is None and trace.rewards["length"].score == 1.0
        [error] = trace.errors
        assert (error.stage, error.failure) == ("scoring:broken", FailureKind.SCORING_ERROR)
        assert "no comparison" in error.message


async def test_a_group_reward_returning_the_wrong_number_of_scores_is_an_error_naming_it():
    @tg.reward(group=True)
    def one_only(task, traces):
        return [1.0]

    ts = taskset(one_only)
    traces = await tg.run_group(ts, ts[0], ScriptedModel(["a", "b"]), rollouts=2)
    assert [t.rewards["one_only"].score for t in traces] == [None, None]
    assert traces[0].errors[0].message == ("group reward 'one_only' returned 1 values; it must return 2 numbers, one "
                                           "per trace of the group")


async def test_a_group_reward_past_the_scoring_timeout_is_a_scoring_timeout():
    @tg.reward(group=True)
    async def slow(task, traces):
        await asyncio.Event().wait()

    ts = taskset(slow)
    traces = await tg.run_group(ts, ts[0], ScriptedModel(["a", "b"]), rollouts=2,
                                timeouts=tg.Timeouts(scoring=0.05))
    assert [t.failure for t in traces] == [FailureKind.SCORING_TIMEOUT] * 2


async def test_a_group_reward_may_be_a_task_method_and_a_group_metric_stays_out_of_the_total():
    class Voting(tg.Task):
        @tg.reward(group=True)
        def majority(self, traces):
            replies = [t.last_reply for t in traces]
            return [float(replies.count(r) * 2 > len(replies)) for r in replies]

        @tg.metric(group=True)
        def distinct(self, traces):
            return [float(len({t.last_reply for t in traces}))] * len(traces)

    class VotingTaskset(tg.Taskset):
        task_class = Voting

    ts = VotingTaskset(id="vote", data=[{"prompt": "q"}])
    traces = await tg.run_group(ts, ts[0], ScriptedModel(rule=reply_by_seed("x", "y", "x")), rollouts=3,
                                sampling=SEEDED)
    assert [t.reward for t in traces] == [1.0, 0.0, 1.0]
    assert [t.metrics["distinct"] for t in traces] == [2.0] * 3


async def test_evaluate_scores_each_task_s_group_and_yields_its_traces_once_the_group_is_done():
    ts = taskset(length, longest)
    replies = {"q": ["a", "ab"], "r": ["abc", "abc"]}
    model = ScriptedModel(rule=lambda request: replies[request.messages[-1].text][request.sampling.seed])
    got = [t async for t in evaluate_iter(ts, model, rollouts=2, concurrency=1, sampling=SEEDED)]
    assert [(t.task.prompt, t.rollout_index, t.rewards["longest"].score) for t in got] == [
        ("q", 0, 0.0), ("q", 1, 1.0), ("r", 0, 1.0), ("r", 1, 1.0)]


async def test_a_group_reward_on_a_multi_agent_taskset_is_refused_naming_it_before_any_episode():
    class Judged(DebateTask):
        @tg.reward(group=True)
        def compared(self, traces):
            return [0.0] * len(traces)

    class JudgedDebate(Debate):
        task_class = Judged

    model = ScriptedModel([])
    with pytest.raises(tg.UsageError, match="'debate': group reward 'compared' on a multi-agent taskset"):
        await tg.evaluate_episodes(JudgedDebate(), model, num_tasks=1)
    assert model.requests == []
