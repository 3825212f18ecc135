"""Message graph with tokens: missing logprobs stay missing, the branch-token cache never changes the answer."""

import msgpack

from tracegym.core.graph import MessageGraph
from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace


def chain(turns: int) -> tuple[MessageGraph, list[int]]:
    """A single branch of `turns` model turns, each prompt extending the last; (graph, last prompt)."""
    graph, prefix = MessageGraph(), []
    for turn in range(turns):
        graph.add(user(f"u{turn}"))
        prompt = [*prefix, 1000 + turn, 2000 + turn]
        graph.add_model_turn(assistant(f"a{turn}"), prompt, [3000 + turn], [-0.5], temperature=1.0)
        prefix = [*prompt, 3000 + turn]
    return graph, prefix


def test_a_turn_without_logprobs_stores_none_not_zeros():
    graph = MessageGraph()
    node = graph.add_model_turn(assistant("a"), [1, 2], [3], None, temperature=1.0)
    assert node.logprobs is None and node.mask == [0, 0, 1]


def test_missing_logprobs_round_trip_through_json_and_msgpack():
    trace = Trace(task=TaskData(prompt="p"))
    trace.graph.add(user("p"))
    trace.graph.add_model_turn(assistant("a"), [1, 2], [3], None, temperature=1.0)
    from_json = Trace.model_validate_json(trace.model_dump_json())
    from_msgpack = Trace.model_validate(msgpack.unpackb(msgpack.packb(trace.model_dump(mode="json"))))
    assert from_json.graph.nodes[1].logprobs is None and from_msgpack.graph.nodes[1].logprobs is None
    assert from_json == trace == from_msgpack


def test_a_same_length_drift_in_the_first_turn_forks_even_after_many_turns():
    graph, prefix = chain(20)
    drifted = [prefix[0] + 1, *prefix[1:], 7]  # first prompt token re-rendered differently, length unchanged
    node = graph.add_model_turn(assistant("late"), drifted, [8], [-0.5], temperature=1.0)
    assert len(graph.branches()) == 2 and graph.tokens(node.id) == [*drifted, 8]
    assert node.token_ids == [*drifted, 8]


def test_the_branch_tokens_are_the_concatenation_along_the_path():
    graph, prefix = chain(5)
    assert graph.tokens() == prefix == graph._path_tokens(graph.head)


def test_a_turn_on_a_sibling_branch_extends_that_branchs_tokens():
    graph = MessageGraph()
    graph.add(user("p"))
    first = graph.add_model_turn(assistant("a"), [1, 2], [3], [-0.5], temperature=1.0)
    graph.add(user("x"))
    graph.add_model_turn(assistant("b"), [1, 2, 3, 4], [5], [-0.5], temperature=1.0)
    graph.add(user("y"), parent=first.id)
    node = graph.add_model_turn(assistant("c"), [1, 2, 3, 6], [7], [-0.5], temperature=1.0)
    assert node.token_ids == [6, 7] and len(graph.branches()) == 2
    assert graph.tokens() == [1, 2, 3, 6, 7]


def test_a_copy_of_the_graph_keeps_its_own_tokens_when_the_original_grows():
    graph, prefix = chain(3)
    graph.tokens()  # fills the cache, which a shallow copy shares
    copy = graph.model_copy(update={"nodes": list(graph.nodes)})
    graph.add(user("more"))
    graph.add_model_turn(assistant("d"), [*prefix, 9], [10], [-0.5], temperature=1.0)
    assert copy.tokens() == prefix and graph.tokens() == [*prefix, 9, 10]


def test_graphs_with_the_same_nodes_are_equal_whatever_their_cache():
    graph, _ = chain(3)
    rebuilt = MessageGraph(nodes=list(graph.nodes))
    assert rebuilt == graph


def test_a_prompt_given_as_a_tuple_extends_the_branch_like_a_list():
    graph, prefix = chain(2)
    graph.add_model_turn(assistant("t"), (*prefix, 5), [6], [-0.5], temperature=1.0)
    assert len(graph.branches()) == 1 and graph.tokens() == [*prefix, 5, 6]
