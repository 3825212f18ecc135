"""Trace -> training samples: one per branch, shared nodes trained once, truncation, validation."""

import pytest

import tracegym as tg
from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.messages import assistant, user
from tracegym.core.trace import StopReason, Trace
from tracegym.testing import ScriptedModel, make_trace, reply, tool_call
from tracegym.train.samples import checked_samples, trace_samples, validate


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


async def tool_trace(**sampling) -> Trace:
    model = ScriptedModel([reply(None, tool_call("add", {"a": 1, "b": 2})), "3"], tokens=True)
    taskset = tg.Taskset(id="adder", data=[{"prompt": "1+2?"}], tools=[add])
    [trace] = await tg.evaluate(taskset, model, sampling=tg.Sampling(**sampling))
    return trace


def tree_trace() -> Trace:
    """Two branches sharing a tokenized model turn: u -> a1 -> (u2 -> a2 | u3 -> a3)."""
    trace = Trace(task=tg.TaskData(prompt="p"))
    g = trace.graph
    g.add(user("p"))
    a1 = g.add_model_turn(assistant("a"), prompt_ids=[1, 2], completion_ids=[3, 4], completion_logprobs=[-1, -2],
                          temperature=0.5)
    g.add(user("x"))
    g.add_model_turn(assistant("b"), prompt_ids=[1, 2, 3, 4, 5], completion_ids=[6], completion_logprobs=[-3],
                     temperature=0.5)
    g.add(user("y"), parent=a1.id)
    g.add_model_turn(assistant("c"), prompt_ids=[1, 2, 3, 4, 8], completion_ids=[9], completion_logprobs=[-4],
                     temperature=0.5)
    return trace


async def test_a_single_branch_becomes_one_sample_of_the_branch_tokens():
    trace = await tool_trace()
    [sample] = trace_samples(trace)
    assert sample.token_ids == trace.graph.tokens()
    assert len(sample.loss_mask) == len(sample.logprobs) == len(sample)


async def test_the_loss_mask_covers_exactly_the_sampled_tokens():
    trace = await tool_trace()
    [sample] = trace_samples(trace)
    sampled = sum(sum(n.mask) for n in trace.graph.nodes if n.sampled)
    assert sample.num_trained == sampled == trace.usage.completion_tokens
    assert all((lp != 0.0) == m for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True))


async def test_temperature_and_reward_come_from_the_trace():
    trace = await tool_trace(temperature=0.7)
    [sample] = trace_samples(trace)
    assert sample.temperature == 0.7 and sample.reward == trace.reward
    assert sample.trace_id == trace.id and sample.task_key == trace.task_key and sample.branch == 0


async def test_a_sample_carries_the_oldest_policy_version_that_sampled_its_branch():
    """The policy moves on mid-rollout: the first turn was sampled by version 3, the second by version 4."""
    def first_turn_then_publish(request):
        if len(request.messages) > 1:
            return "3"
        model.policy_version = 4  # the trainer publishes while this turn is served (its version was read at arrival)
        return reply(None, tool_call("add", {"a": 1, "b": 2}))

    model = ScriptedModel(rule=first_turn_then_publish, tokens=True)
    model.policy_version = 3
    taskset = tg.Taskset(id="adder", data=[{"prompt": "1+2?"}], tools=[add])
    [trace] = await tg.evaluate(taskset, model)
    assert [n.policy_version for n in trace.graph.nodes if n.sampled] == [3, 4]
    assert trace.policy_version == 3
    [sample] = trace_samples(trace)
    assert sample.policy_version == 3


def test_each_branch_takes_the_oldest_version_on_its_own_path():
    trace = tree_trace()
    versions = {1: 6, 3: 5, 5: 7}  # a1 (shared), then b on the first branch and c on the second
    trace.graph.nodes = [n.model_copy(update={"policy_version": versions.get(n.id)})
                         for n in trace.graph.nodes]
    first, second = trace_samples(trace)
    assert (first.policy_version, second.policy_version) == (5, 6)


def test_a_node_shared_by_two_branches_is_trained_once():
    first, second = trace_samples(tree_trace())
    assert first.token_ids == [1, 2, 3, 4, 5, 6] and second.token_ids == [1, 2, 3, 4, 8, 9]
    assert first.loss_mask == [False, False, True, True, False, True]
    assert second.loss_mask == [False, False, False, False, False, True]
    assert second.logprobs == [0.0, 0.0, 0.0, 0.0, 0.0, -4.0]


def test_a_forked_trace_gives_one_sample_per_branch():
    trace = Trace(task=tg.TaskData(prompt="p"))
    trace.graph.add(user("p"))
    trace.graph.add_model_turn(assistant("a"), [1, 2], [3], [-1.0], temperature=1.0)
    trace.graph.add(user("x"))
    trace.graph.add_model_turn(assistant("b"), [1, 9, 3, 4], [5], [-1.0], temperature=1.0)  # drift: forks
    first, second = trace_samples(trace)
    assert first.token_ids == [1, 2, 3] and second.token_ids == [1, 9, 3, 4, 5]
    assert second.loss_mask == [False, False, False, False, True]


async def test_a_truncated_rollout_keeps_its_sampled_tokens():
    model = ScriptedModel(["cut short"], tokens=True, finish_reason="length")
    [trace] = await tg.evaluate(tg.Taskset(id="t", data=[{"prompt": "q"}]), model)
    [sample] = trace_samples(trace)
    assert trace.stop_reason == StopReason.TRUNCATED
    assert sample.num_trained > 0 and sample.meta == {"truncated": 1.0}


def test_a_trace_without_tokens_gives_no_samples_and_fails_validation():
    trace = make_trace()
    assert trace_samples(trace) == []
    assert any("no token ids" in p for p in validate(trace))


async def test_a_good_trace_validates_clean():
    assert validate(await tool_trace()) == []


def test_validation_reports_a_misaligned_mask():
    trace = tree_trace()
    node = trace.graph.nodes[1]
    trace.graph.nodes[1] = node.model_copy(update={"mask": node.mask[:-1]})
    assert any("node 1" in p and "mask" in p for p in validate(trace))


def test_validation_reports_mixed_temperatures_on_a_branch():
    trace = tree_trace()
    node = trace.graph.nodes[3]
    trace.graph.nodes[3] = node.model_copy(update={"temperature": 1.0})
    assert any("different temperatures" in p for p in validate(trace))


def one_turn(logprobs: list[float] | None = (-1.0,), temperature: float = 1.0) -> Trace:
    trace = Trace(task=tg.TaskData(prompt="p"))
    trace.graph.add(user("p"))
    trace.graph.add_model_turn(assistant("a"), [1, 2], [3], None if logprobs is None else list(logprobs),
                               temperature=temperature)
    return trace


def test_a_sampled_turn_without_logprobs_fails_validation():
    assert validate(trace := one_turn(logprobs=None)) == [f"trace {trace.id}: node 1: sampled turn without logprobs"]


def test_a_sampled_turn_without_logprobs_is_refused_not_trained_with_zeros():
    with pytest.raises(ValueError, match="node 1: sampled turn without logprobs"):
        trace_samples(one_turn(logprobs=None))


def test_a_greedy_turn_fails_validation():
    [problem] = validate(one_turn(temperature=0.0))
    assert "node 1: sampled at temperature 0.0 (greedy)" in problem


def test_a_greedy_turn_is_refused_for_training():
    with pytest.raises(ValueError, match=r"temperature 0\.0 \(greedy\)"):
        trace_samples(one_turn(temperature=0.0))


def test_checked_samples_drops_an_invalid_trace_and_says_why():
    samples, problems = checked_samples(one_turn(logprobs=None))
    assert samples == [] and len(problems) == 1 and "without logprobs" in problems[0]


def test_checked_samples_of_a_valid_trace_are_its_samples():
    trace = one_turn()
    assert checked_samples(trace) == (trace_samples(trace), [])


def test_a_rollout_that_failed_before_any_tokens_has_no_samples_and_no_token_problems():
    trace = make_trace()
    trace.errors.append(TraceError(kind=ErrorKind.INFRASTRUCTURE, stage="model", message="endpoint down"))
    assert checked_samples(trace) == ([], [])
