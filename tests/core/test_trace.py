"""Trace: derived values, JSON round trip, schema version."""

import msgpack
import pytest

from tracegym.core.errors import ErrorKind, FailureKind, TraceError
from tracegym.core.graph import MessageGraph
from tracegym.core.messages import assistant, user
from tracegym.core.timing import Span
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.testing import make_trace


def test_reward_is_the_weighted_sum():
    trace = make_trace()
    trace.rewards["extra"] = RewardScore(score=0.5, weight=2.0)
    assert trace.reward == 2.0


def test_reward_is_none_when_any_reward_is_unscored():
    assert make_trace(reward=None).reward is None


def test_json_round_trip_is_lossless():
    trace = make_trace()
    assert Trace.model_validate_json(trace.model_dump_json()) == trace


def test_msgpack_round_trip_is_lossless():
    trace = make_trace()
    packed = msgpack.packb(trace.model_dump(mode="json"))
    assert Trace.model_validate(msgpack.unpackb(packed)) == trace


def test_newer_schema_version_is_refused():
    data = make_trace().model_dump(mode="json")
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema version 99"):
        Trace.model_validate(data)


def _two_turn_graph() -> MessageGraph:
    """A user turn, a model turn with tokens [1, 2 | 3], and a second user turn."""
    graph = MessageGraph()
    graph.add(user("a"))
    graph.add_model_turn(assistant("b"), prompt_ids=[1, 2], completion_ids=[3])
    graph.add(user("c"))
    return graph


def test_model_turn_extending_the_branch_adds_only_new_tokens():
    graph = _two_turn_graph()
    node = graph.add_model_turn(assistant("d"), prompt_ids=[1, 2, 3, 4], completion_ids=[5])
    assert node.token_ids == [4, 5] and node.mask == [0, 1]
    assert graph.tokens() == [1, 2, 3, 4, 5]
    assert len(graph.branches()) == 1


def test_drifted_prompt_forks_a_new_branch():
    graph = _two_turn_graph()
    graph.add_model_turn(assistant("d"), prompt_ids=[1, 9, 3, 4], completion_ids=[5])
    assert len(graph.branches()) == 2
    assert graph.tokens() == [1, 9, 3, 4, 5]


def test_a_forks_copies_are_not_marked_sampled_and_name_their_originals():
    graph = _two_turn_graph()
    graph.add_model_turn(assistant("d"), prompt_ids=[1, 9, 3, 4], completion_ids=[5])  # forks: copies 0..2
    graph.add(user("e"))
    graph.add_model_turn(assistant("f"), prompt_ids=[7, 9, 3, 4, 5, 6], completion_ids=[8])  # forks again
    assert [n.id for n in graph.nodes if n.sampled and not n.token_ids] == []
    copies = [n for n in graph.nodes if n.copy_of is not None]
    assert all(not n.sampled and not n.token_ids for n in copies)
    assert {n.copy_of for n in copies if n.message.text == "b"} == {1}  # a copy of a copy names the original
    assert graph.copied_turns() == 3  # "b" twice, "d" once
    assert sum(graph.is_model_turn(n) for n in graph.path()) == 3


def _tokenized_trace() -> Trace:
    trace = make_trace()
    trace.graph.add(user("again"))
    trace.graph.add_model_turn(assistant("d"), prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                               completion_logprobs=[-0.25, -1.5e-9], temperature=0.7)
    trace.graph.add(user("x"))
    trace.graph.add_model_turn(assistant("e"), prompt_ids=[9, 2], completion_ids=[6], temperature=0.7)  # forks
    return trace


def test_json_round_trip_keeps_tokens_masks_logprobs_and_forks():
    trace = _tokenized_trace()
    assert Trace.model_validate_json(trace.model_dump_json()) == trace


def test_msgpack_round_trip_keeps_tokens_masks_logprobs_and_forks():
    trace = _tokenized_trace()
    packed = msgpack.packb(trace.model_dump(mode="json"))
    back = Trace.model_validate(msgpack.unpackb(packed))
    assert back == trace and back.graph.tokens() == [9, 2, 6] and len(back.branches) == 2


def test_duration_sums_a_stage_and_its_named_sub_stages_only():
    trace = make_trace()
    trace.spans = [Span(name="tool:a", start=0.0, end=1.0), Span(name="tool:b", start=1.0, end=1.5),
                   Span(name="toolbox", start=2.0, end=9.0), Span(name="total", start=0.0, end=10.0)]
    assert trace.duration("tool") == 1.5 and trace.duration("tool:b") == 0.5
    assert trace.duration() == 10.0 and trace.duration("model") == 0.0


NORMAL_ENDS = (StopReason.COMPLETED, StopReason.STOP_CONDITION, StopReason.MAX_TURNS, StopReason.TRUNCATED)


def test_only_an_error_a_timeout_a_cancel_or_no_end_is_not_a_normal_end():
    assert {s for s in StopReason if s.is_normal_end} == set(NORMAL_ENDS)
    for stop in StopReason:
        assert make_trace(stop_reason=stop).ended_normally is (stop in NORMAL_ENDS)
    assert not make_trace(stop_reason=None).ended_normally


def test_ok_is_a_normal_end_with_every_reward_scored_and_a_rollout_that_is_not_ok_is_a_failure():
    assert make_trace().ok and not make_trace(reward=None).ok
    assert not make_trace(stop_reason=StopReason.ERROR).ok
    for stop in [*StopReason, None]:
        for reward in (1.0, None):
            trace = make_trace(stop_reason=stop, reward=reward)
            assert trace.ok or trace.failure is not None


def test_a_rollout_that_ended_on_the_models_output_has_no_failure():
    for stop in (StopReason.COMPLETED, StopReason.STOP_CONDITION, StopReason.MAX_TURNS, StopReason.TRUNCATED):
        assert make_trace(stop_reason=stop).failure is None


def test_a_truncation_by_the_context_window_is_not_a_failure():
    trace = make_trace(stop_reason=StopReason.TRUNCATED)
    trace.errors.append(TraceError(kind=ErrorKind.MODEL, stage="model", message="maximum context length"))
    assert trace.failure is None


def test_a_recovered_tool_error_is_not_a_failure_but_a_tool_timeout_is():
    trace = make_trace()
    trace.errors.append(TraceError(kind=ErrorKind.TOOL, stage="tool:add", message="ValueError: bad"))
    assert trace.failure is None
    trace.errors.append(TraceError(kind=ErrorKind.TIMEOUT, stage="tool:add", message="timed out after 60s"))
    assert trace.failure == FailureKind.TOOL_TIMEOUT


def test_failures_outside_the_model_are_named_by_kind():
    assert make_trace(error=ErrorKind.INFRASTRUCTURE).failure == FailureKind.MODEL_UNAVAILABLE
    assert make_trace(error=ErrorKind.TASK).failure == FailureKind.TASK_ERROR
    assert make_trace(stop_reason=StopReason.TIMEOUT, reward=None).failure == FailureKind.ROLLOUT_TIMEOUT
    assert make_trace(stop_reason=StopReason.CANCELLED, reward=None).failure == FailureKind.CANCELLED
    assert make_trace(stop_reason=None).failure == FailureKind.UNFINISHED


def test_a_reward_that_failed_is_a_scoring_failure():
    trace = make_trace(reward=None)
    trace.errors.append(TraceError(kind=ErrorKind.TASK, stage="scoring:reward", message="KeyError: 'x'"))
    assert trace.failure == FailureKind.SCORING_ERROR


def test_the_error_that_ended_the_rollout_decides_its_failure_over_an_earlier_recovered_one():
    trace = make_trace(reward=None, stop_reason=StopReason.ERROR)
    trace.errors += [TraceError(kind=ErrorKind.TIMEOUT, stage="tool:search", message="timed out"),
                     TraceError(kind=ErrorKind.MODEL, stage="model", message="400: bad request")]
    assert trace.failure == FailureKind.MODEL_ERROR and trace.failure_record == trace.errors[1]


def test_every_failed_trace_carries_one_failure_with_its_stage():
    for stop in [*StopReason, None]:
        for error in (None, *ErrorKind):
            trace = make_trace(stop_reason=stop, error=error, reward=None if error else 1.0)
            record = trace.failure_record
            assert (record is None) is (trace.failure is None)
            assert record is None or (record.failure in FailureKind and record.stage)


def test_the_trace_policy_version_is_the_oldest_of_its_sampled_nodes():
    trace = make_trace()
    assert trace.policy_version is None
    trace.graph.add_model_turn(assistant("more"), policy_version=4)
    trace.graph.add_model_turn(assistant("again"), policy_version=2)
    assert trace.policy_version == 2
