"""Scorers: rewards, metrics and stops as methods or plain functions, sync or async, with weights and order."""

from fractions import Fraction

import pytest

import tracegym as tg
from tracegym.core.trace import RewardScore
from tracegym.testing import ScriptedModel

ROW = {"prompt": "say yes", "answer": "yes"}


class Methods(tg.Task):
    @tg.reward
    def sync_reward(self, trace):
        return float(trace.last_reply == self.data.answer)

    @tg.reward
    async def async_reward(self, trace):
        return 0.5

    @tg.metric
    def sync_metric(self, trace):
        return len(trace.last_reply)

    @tg.metric
    async def async_metric(self, trace):
        return 2.0


class MethodsTaskset(tg.Taskset):
    id = "methods"
    task_class = Methods


def plain_reward(task, trace):
    return float(trace.last_reply == task.data.answer)


async def async_plain_reward(task, trace):
    return 0.25


def plain_metric(task, trace):
    return 7.0


async def async_plain_metric(task, trace):
    return 8.0


async def run(taskset, replies=("yes",)):
    [trace] = await tg.evaluate(taskset, ScriptedModel(list(replies)))
    return trace


async def test_method_rewards_sync_and_async_are_scored():
    trace = await run(MethodsTaskset(data=[ROW]))
    assert {k: r.score for k, r in trace.rewards.items()} == {"sync_reward": 1.0, "async_reward": 0.5}


async def test_method_metrics_sync_and_async_are_scored():
    trace = await run(MethodsTaskset(data=[ROW]))
    assert trace.metrics == {"sync_metric": 3.0, "async_metric": 2.0}


async def test_plain_function_rewards_sync_and_async_are_scored():
    trace = await run(tg.Taskset(id="t", data=[ROW], rewards=[plain_reward, async_plain_reward]))
    assert {k: r.score for k, r in trace.rewards.items()} == {"plain_reward": 1.0, "async_plain_reward": 0.25}


async def test_plain_function_metrics_sync_and_async_are_scored():
    trace = await run(tg.Taskset(id="t", data=[ROW], metrics=[plain_metric, async_plain_metric]))
    assert trace.metrics == {"plain_metric": 7.0, "async_plain_metric": 8.0}


async def test_plain_function_receives_the_task_and_the_trace():
    seen = []

    def spy(task, trace):
        seen.append((task.data.answer, trace.last_reply))
        return 1.0

    await run(tg.Taskset(id="t", data=[ROW], rewards=[spy]))
    assert seen == [("yes", "yes")]


async def test_taskset_functions_add_to_the_task_methods():
    trace = await run(MethodsTaskset(data=[ROW], rewards=[plain_reward]))
    assert set(trace.rewards) == {"sync_reward", "async_reward", "plain_reward"}


async def test_trace_reward_is_the_weighted_sum_of_the_rewards():
    @tg.reward(weight=2.0)
    def heavy(task, trace):
        return 1.0

    @tg.reward(weight=0.5)
    def light(task, trace):
        return 0.5

    trace = await run(tg.Taskset(id="t", data=[ROW], rewards=[heavy, light]))
    assert trace.rewards["heavy"].weight == 2.0 and trace.reward == pytest.approx(2.25)


async def test_metric_never_counts_in_the_reward():
    trace = await run(tg.Taskset(id="t", data=[ROW], rewards=[plain_reward], metrics=[plain_metric]))
    assert trace.reward == 1.0 and trace.metrics["plain_metric"] == 7.0


async def test_decorator_name_replaces_the_function_name():
    @tg.reward(name="exact")
    def f(task, trace):
        return 1.0

    trace = await run(tg.Taskset(id="t", data=[ROW], rewards=[f]))
    assert list(trace.rewards) == ["exact"]


async def test_order_decides_evaluation_order():
    calls = []

    def recorder(label, kind, order):
        def fn(task, trace):
            calls.append(label)
            return 1.0

        fn.__name__ = label
        return kind(fn, order=order)

    rewards = [recorder("late_reward", tg.reward, 3), recorder("early_reward", tg.reward, 1)]
    metrics = [recorder("middle_metric", tg.metric, 2), recorder("first_metric", tg.metric, 0)]
    await run(tg.Taskset(id="t", data=[ROW], rewards=rewards, metrics=metrics))
    assert calls == ["first_metric", "early_reward", "middle_metric", "late_reward"]


async def test_order_applies_across_methods_and_functions():
    calls = []

    class Ordered(tg.Task):
        @tg.reward(order=2)
        def method_second(self, trace):
            calls.append("method_second")
            return 1.0

    @tg.metric(order=1)
    def function_first(task, trace):
        calls.append("function_first")
        return 1.0

    class OrderedTaskset(tg.Taskset):
        id = "ordered"
        task_class = Ordered

    await run(OrderedTaskset(data=[ROW], metrics=[function_first]))
    assert calls == ["function_first", "method_second"]


class Game(tg.Task):
    """Answers every turn, so only a stop or max_turns ends the rollout."""

    max_turns = 5

    async def env_response(self, trace):
        return "again"


class GameTaskset(tg.Taskset):
    id = "game"
    task_class = Game


async def test_stop_function_ends_the_rollout_with_stop_condition():
    def said_yes(task, trace):
        return trace.last_reply == "yes"

    trace = await run(GameTaskset(data=[ROW], stops=[said_yes]), replies=("no", "yes", "no"))
    assert trace.stop_reason == tg.StopReason.STOP_CONDITION and trace.stopped_by == "said_yes"
    assert trace.num_turns == 2


async def test_async_stop_method_ends_the_rollout():
    class Stopping(Game):
        @tg.stop(name="first_turn")
        async def done(self, trace):
            return True

    class StoppingTaskset(tg.Taskset):
        id = "stopping"
        task_class = Stopping

    trace = await run(StoppingTaskset(data=[ROW]))
    assert trace.stopped_by == "first_turn" and trace.num_turns == 1


async def test_rollout_ended_by_a_stop_is_still_scored():
    trace = await run(GameTaskset(data=[ROW], rewards=[plain_reward], stops=[lambda task, trace: True]))
    assert trace.stop_reason == tg.StopReason.STOP_CONDITION and trace.reward == 1.0


async def test_stop_is_not_recorded_as_a_reward_or_metric():
    def never(task, trace):
        return False

    trace = await run(GameTaskset(data=[ROW], stops=[never]))
    assert trace.stop_reason == tg.StopReason.MAX_TURNS and "never" not in trace.metrics and not trace.rewards


def test_metric_given_as_a_reward_is_a_usage_error():
    @tg.metric
    def length(task, trace):
        return 1.0

    with pytest.raises(tg.UsageError, match=r"length is marked as a metric, but was given as a reward"):
        tg.Taskset(id="t", data=[ROW], rewards=[length])


def test_reward_given_as_a_stop_is_a_usage_error():
    @tg.reward
    def exact(task, trace):
        return 1.0

    with pytest.raises(tg.UsageError, match=r"exact is marked as a reward, but was given as a stop"):
        tg.Taskset(id="t", data=[ROW], stops=[exact])


class Graded(Game):
    """A base whose reward, metric and stop are all decorated; the overrides below replace them."""

    @tg.reward(weight=2.0)
    def exact(self, trace):
        return 0.0

    @tg.metric
    def length(self, trace):
        return 0.0

    @tg.stop
    def said_yes(self, trace):
        return False


def taskset_of(task_class):
    class Of(tg.Taskset):
        id = "overrides"

    Of.task_class = task_class
    return Of(data=[ROW])


async def test_an_undecorated_reward_override_runs_its_own_body_with_the_bases_weight():
    class Derived(Graded):
        def exact(self, trace):
            return 1.0

    trace = await run(taskset_of(Derived))
    assert trace.rewards["exact"] == RewardScore(score=1.0, weight=2.0)


async def test_a_decorated_reward_override_uses_its_own_weight():
    class Derived(Graded):
        @tg.reward(weight=0.5)
        def exact(self, trace):
            return 1.0

    trace = await run(taskset_of(Derived))
    assert trace.rewards["exact"] == RewardScore(score=1.0, weight=0.5)


async def test_an_undecorated_metric_override_runs_its_own_body():
    class Derived(Graded):
        def length(self, trace):
            return 3.0

    trace = await run(taskset_of(Derived))
    assert trace.metrics["length"] == 3.0


async def test_a_decorated_metric_override_can_rename_the_metric():
    class Derived(Graded):
        @tg.metric(name="size")
        def length(self, trace):
            return 3.0

    trace = await run(taskset_of(Derived))
    assert trace.metrics["size"] == 3.0 and "length" not in trace.metrics


async def test_an_undecorated_stop_override_runs_its_own_body():
    class Derived(Graded):
        def said_yes(self, trace):
            return trace.last_reply == "yes"

    trace = await run(taskset_of(Derived), replies=("no", "yes", "no"))
    assert trace.stopped_by == "said_yes" and trace.num_turns == 2


async def test_a_decorated_stop_override_uses_its_own_name():
    class Derived(Graded):
        @tg.stop(name="first_turn")
        def said_yes(self, trace):
            return True

    trace = await run(taskset_of(Derived))
    assert trace.stopped_by == "first_turn" and trace.num_turns == 1


async def test_an_override_set_to_none_is_no_longer_a_scorer():
    class Derived(Graded):
        exact = None
        length = None

    trace = await run(taskset_of(Derived))
    assert not trace.rewards and "length" not in trace.metrics


# --- what a reward or metric may return ------------------------------------------------------------------
@pytest.mark.parametrize("kind", [tg.reward, tg.metric])
async def test_a_scorer_that_returns_a_string_is_a_task_error_naming_it_and_the_type(kind):
    @kind
    def half(task, trace):
        return "0.5"

    options = {"rewards": [half]} if kind is tg.reward else {"metrics": [half]}
    trace = await run(tg.Taskset(id="t", data=[ROW], **options))
    scored = trace.rewards["half"].score if kind is tg.reward else trace.metrics["half"]
    assert scored is None
    [error] = trace.errors
    assert (error.kind, error.stage) == (tg.ErrorKind.TASK, "scoring:half")
    assert "'half' returned str '0.5'" in error.message and "number" in error.message


async def test_a_reward_that_returns_none_is_a_task_error():
    def forgot(task, trace):
        float(trace.last_reply == "yes")

    trace = await run(tg.Taskset(id="t", data=[ROW], rewards=[forgot]))
    assert trace.rewards["forgot"].score is None and "returned NoneType" in trace.errors[0].message


async def test_any_real_number_or_bool_is_a_score_numpy_scalars_included():
    np = pytest.importorskip("numpy")
    values = {"boolean": True, "integer": 2, "fraction": Fraction(1, 4), "np_float": np.float32(0.5),
              "np_int": np.int64(3), "np_bool": np.bool_(True)}
    metrics = [tg.metric(lambda task, trace, v=v: v, name=name) for name, v in values.items()]
    trace = await run(tg.Taskset(id="t", data=[ROW], metrics=metrics))
    assert trace.errors == []
    assert {name: trace.metrics[name] for name in values} == {
        "boolean": 1.0, "integer": 2.0, "fraction": 0.25, "np_float": 0.5, "np_int": 3.0, "np_bool": 1.0}
    assert all(type(trace.metrics[name]) is float for name in values)
