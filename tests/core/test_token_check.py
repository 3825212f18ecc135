"""Token check: the branch invariant and per-node alignment, and where a branch's token prefix ends."""

import pytest

from tracegym.core.graph import MessageGraph, TokenPrefix
from tracegym.core.messages import assistant, tool, user
from tracegym.core.task_data import TaskData
from tracegym.core.token_check import check_turn, validate_tokens
from tracegym.core.trace import Trace


def two_turns() -> Trace:
    trace = Trace(task=TaskData(prompt="p"))
    trace.graph.add(user("p"))
    trace.graph.add_model_turn(assistant("a"), [1, 2], [3, 4], [-0.1, -0.2], temperature=1.0)
    trace.graph.add(tool("r", "c1"))
    trace.graph.add_model_turn(assistant("b"), [1, 2, 3, 4, 5], [6], [-0.3], temperature=1.0)
    return trace


def test_a_consistent_trace_has_no_problems():
    assert validate_tokens(two_turns()) == []


def test_a_trace_without_any_tokens_has_no_problems():
    graph = MessageGraph()
    graph.add(user("p"))
    graph.add(assistant("a"), sampled=True)
    assert validate_tokens(Trace(task=TaskData(prompt="p"), graph=graph)) == []


def test_a_model_turn_missing_its_tokens_is_reported():
    trace = two_turns()
    trace.graph.add(user("more"))
    trace.graph.add(assistant("c"), sampled=True)
    assert validate_tokens(trace) == ["node 5: model turn without tokens"]


def test_logprobs_on_prompt_tokens_are_reported():
    trace = two_turns()
    node = trace.graph.nodes[3]
    trace.graph.nodes[3] = node.model_copy(update={"logprobs": [-1.0, -0.3]})
    assert validate_tokens(trace) == ["node 3: prompt tokens carry logprobs (must be 0.0)"]


def test_a_positive_logprob_is_reported():
    trace = two_turns()
    node = trace.graph.nodes[1]
    trace.graph.nodes[1] = node.model_copy(update={"logprobs": [0.0, 0.0, -0.1, 0.5]})
    assert "node 1: sampled tokens with a logprob that is not finite and <= 0" in validate_tokens(trace)


def test_check_turn_confirms_the_branch_is_the_calls_prompt_and_completion():
    trace = two_turns()
    assert check_turn(trace.graph, 3, [1, 2, 3, 4, 5], [6]) == []
    wrong = check_turn(trace.graph, 3, [1, 2, 3, 4], [5, 6])
    assert wrong == ["node 3: sampled tokens differ from the call's completion"]


def test_prefix_split_names_the_covered_messages_and_the_last_completion():
    trace = two_turns()
    trace.graph.add(user("again"))
    assert trace.graph.prefix_split() == (4, 1)


def test_prefix_split_of_an_untokenized_graph_is_empty():
    graph = MessageGraph()
    graph.add(user("p"))
    assert graph.prefix_split() == (0, 0)


def test_the_token_prefix_is_the_branch_tokens_split_at_the_last_completion():
    trace = two_turns()
    trace.graph.add(user("again"))
    prefix = trace.graph.token_prefix()
    assert prefix == TokenPrefix([1, 2, 3, 4, 5, 6], covered_messages=4, completion_length=1)
    assert (prefix.prompt_ids, prefix.completion_ids) == ([1, 2, 3, 4, 5], [6])


def test_no_token_prefix_before_a_sampled_turn():
    graph = MessageGraph()
    graph.add(user("p"))
    assert graph.token_prefix() is None


@pytest.mark.parametrize(("ids", "covered", "sampled"), [([1, 2], 0, 1), ([1, 2], 1, 0), ([1, 2], 1, 3)])
def test_a_token_prefix_whose_parts_do_not_fit_together_is_refused(ids, covered, sampled):
    with pytest.raises(ValueError, match="token prefix"):
        TokenPrefix(ids, covered, sampled)


def test_a_sampled_turn_without_logprobs_is_reported():
    trace = Trace(task=TaskData(prompt="p"))
    trace.graph.add(user("p"))
    trace.graph.add_model_turn(assistant("a"), [1, 2], [3, 4], None, temperature=1.0)
    assert validate_tokens(trace) == ["node 1: sampled turn without logprobs"]


def test_logprobs_not_aligned_with_the_ids_are_reported():
    trace = two_turns()
    node = trace.graph.nodes[1]
    trace.graph.nodes[1] = node.model_copy(update={"logprobs": node.logprobs[:-1]})
    assert validate_tokens(trace) == ["node 1: 4 token ids, 4 mask entries, 3 logprobs"]


def test_check_turn_reports_a_branch_that_is_not_the_calls_prompt():
    trace = two_turns()
    wrong = check_turn(trace.graph, 3, [1, 2, 3, 4, 7], [6])
    assert wrong == ["node 3: branch tokens differ from the call's prompt + completion"]
