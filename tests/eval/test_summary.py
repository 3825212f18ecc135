"""Summary: reward with CI, pass@k against brute force, avg@k, errors, tokens, JSON round trip, rendering."""

import itertools
import math
import random
import statistics

import pytest
from rich.console import Console

from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.trace import StopReason, Trace, Usage
from tracegym.eval.summary import Stat, Summary, pass_at_k, summarize, summary_lines, summary_table
from tracegym.testing import make_trace


def _trace(task: str = "t", reward: float | None = 1.0, index: int = 0, **fields: object) -> Trace:
    """A trace of task `task` (its key is the hash of that prompt) at rollout `index`."""
    return make_trace(prompt=task, reward=reward, rollout_index=index, **fields)


def _brute_force_pass_at_k(groups: dict[str, list[float]], k: int, threshold: float) -> float | None:
    """Mean over tasks with >= k rollouts of the share of k-subsets in which any rollout passes."""
    per_task = []
    for rewards in groups.values():
        if len(rewards) >= k:
            subsets = list(itertools.combinations(rewards, k))
            per_task.append(sum(any(r >= threshold for r in s) for s in subsets) / len(subsets))
    return statistics.fmean(per_task) if per_task else None


@pytest.mark.parametrize("seed", range(8))
def test_pass_at_k_matches_brute_force_over_random_cases(seed):
    rng = random.Random(seed)
    threshold = rng.choice([0.5, 1.0])
    groups = {f"task{t}": [rng.choice([0.0, 0.5, 1.0]) for _ in range(rng.randint(1, 7))] for t in range(5)}
    traces = [_trace(task, r, i) for task, rewards in groups.items() for i, r in enumerate(rewards)]
    summary = summarize(traces, pass_threshold=threshold)
    assert list(summary.pass_at_k) == list(range(1, max(map(len, groups.values())) + 1))
    for k, value in summary.pass_at_k.items():
        assert value == pytest.approx(_brute_force_pass_at_k(groups, k, threshold))


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (5, 2, 3), (10, 1, 4), (200, 3, 100)])
def test_pass_at_k_equals_the_binomial_formula(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_is_stable_for_large_n():
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_reward_mean_std_and_ci95_on_a_known_sample():
    summary = summarize([_trace(f"t{r}", r) for r in (1.0, 2.0, 3.0, 4.0)])
    assert summary.reward == 2.5
    assert summary.reward_std == pytest.approx(math.sqrt(5 / 3))
    assert summary.reward_ci95 == pytest.approx(1.96 * math.sqrt(5 / 3) / 2)


def test_ci95_is_zero_for_a_single_scored_trace():
    summary = summarize([_trace(reward=0.7)])
    assert summary.reward_ci95 == 0.0 and summary.reward_std == 0.0


def test_unscored_traces_are_counted_but_left_out_of_means():
    summary = summarize([_trace("a", 1.0), _trace("b", None), _trace("c", 0.0)])
    assert summary.num_traces == 3 and summary.num_scored == 2
    assert summary.reward == 0.5
    assert summary.rewards["reward"] == Stat(mean=0.5, count=2)


def test_reward_is_none_when_nothing_is_scored():
    summary = summarize([_trace(reward=None)])
    assert summary.reward is None and summary.rewards["reward"] == Stat(mean=None, count=0)


def test_metric_means_skip_unset_values():
    traces = [_trace("a", metrics={"m": 2.0}), _trace("b", metrics={"m": None}), _trace("c", metrics={"m": 4.0})]
    assert summarize(traces).metrics == {"m": Stat(mean=3.0, count=2)}


def test_errors_by_kind_counts_traces_not_errors():
    twice = _trace("a", error=ErrorKind.TOOL)
    twice.errors.append(TraceError(kind=ErrorKind.TOOL, stage="tool:calc", message="again"))
    summary = summarize([twice, _trace("b", error=ErrorKind.TOOL), _trace("c", error=ErrorKind.MODEL), _trace("d")])
    assert summary.errors_by_kind == {"model": 1, "tool": 2, "task": 0, "timeout": 0, "infrastructure": 0,
                                     "judge": 0}


def test_failures_count_each_failed_trace_once_by_its_failure_kind():
    unavailable = _trace("a", error=ErrorKind.INFRASTRUCTURE)  # the error that ended it, after a recovered one
    unavailable.errors.insert(0, TraceError(kind=ErrorKind.TIMEOUT, stage="tool:search", message="late"))
    traces = [unavailable, _trace("b", stop_reason=StopReason.TIMEOUT), _trace("c", stop_reason=StopReason.CANCELLED),
              _trace("d")]
    summary = summarize(traces)
    assert summary.failures == {"cancelled": 1, "model_unavailable": 1, "rollout_timeout": 1}
    assert "failures: cancelled 1, model_unavailable 1, rollout_timeout 1" in summary_lines(summary)


def test_errored_traces_count_error_and_timeout_stops():
    traces = [_trace("a", error=ErrorKind.MODEL), _trace("b", stop_reason=StopReason.TIMEOUT), _trace("c")]
    summary = summarize(traces)
    assert summary.errored_traces == 2
    assert summary.stop_reasons == {"error": 1, "timeout": 1, "completed": 1}


def test_num_tasks_and_rollouts_per_task_count_every_trace():
    traces = [_trace("a", 1.0, 0), _trace("a", None, 1), _trace("a", 0.0, 2), _trace("b", 1.0, 0)]
    summary = summarize(traces)
    assert summary.num_tasks == 2 and summary.rollouts_per_task == 3


def test_avg_at_k_is_the_mean_of_every_scored_rollout_of_each_task():
    traces = [_trace("a", 0.0, 2), _trace("a", 1.0, 0), _trace("a", 0.5, 1)]
    assert summarize(traces).avg_at_k == {1: 0.5, 2: 0.5, 3: 0.5}


def test_avg_at_k_averages_per_task_means_over_the_tasks_with_k_scored_rollouts():
    traces = [_trace("a", 1.0, 0), _trace("a", 0.0, 1), _trace("a", 0.0, 2), _trace("b", 1.0, 0),
              _trace("b", None, 1), _trace("b", None, 2)]
    summary = summarize(traces)
    assert summary.avg_at_k[1] == pytest.approx((1 / 3 + 1.0) / 2)
    assert summary.avg_at_k[2] == pytest.approx(1 / 3) and summary.avg_at_k[3] == pytest.approx(1 / 3)


def test_the_number_of_tasks_behind_each_k_is_reported():
    traces = [_trace("a", 1.0, i) for i in range(3)] + [_trace("b", 0.0, 0), _trace("b", None, 1)]
    traces += [_trace("c", None, 0)]
    assert summarize(traces).tasks_at_k == {1: 2, 2: 1, 3: 1}


@pytest.mark.parametrize("seed", range(8))
def test_pass_at_1_equals_avg_at_1_exactly_on_a_binary_reward_with_unequal_rollout_counts(seed):
    rng = random.Random(seed)
    traces = [_trace(f"t{t}", rng.choice([0.0, 1.0, None]), i) for t in range(7) for i in range(rng.randint(1, 9))]
    summary = summarize(traces)
    assert summary.pass_at_k[1] == summary.avg_at_k[1]
    assert summary.pass_at_k_ci95[1] == summary.avg_at_k_ci95[1]


def test_pass_at_k_and_avg_at_k_have_95_intervals_over_tasks():
    traces = [_trace("a", 1.0, 0), _trace("a", 1.0, 1), _trace("b", 1.0, 0), _trace("b", 0.0, 1),
              _trace("c", 0.0, 0), _trace("c", 0.0, 1)]
    summary = summarize(traces)
    assert summary.avg_at_k_ci95[2] == pytest.approx(1.96 * statistics.stdev([1.0, 0.5, 0.0]) / math.sqrt(3))
    assert summary.pass_at_k_ci95[2] == pytest.approx(1.96 * statistics.stdev([1.0, 1.0, 0.0]) / math.sqrt(3))


def test_an_interval_over_a_single_task_is_zero():
    summary = summarize([_trace("a", 1.0, 0), _trace("a", 0.0, 1)])
    assert summary.pass_at_k_ci95 == {1: 0.0, 2: 0.0} and summary.avg_at_k_ci95 == {1: 0.0, 2: 0.0}


def test_tasks_with_fewer_than_k_scored_rollouts_are_skipped_for_that_k():
    passing = [_trace("a", 1.0, i) for i in range(3)]
    failing = [_trace("b", 0.0, 0), _trace("b", None, 1), _trace("b", None, 2)]
    summary = summarize(passing + failing)
    assert summary.pass_at_k == {1: 0.5, 2: 1.0, 3: 1.0}
    assert summary.avg_at_k == {1: 0.5, 2: 1.0, 3: 1.0}


def test_k_that_no_task_reaches_is_none():
    summary = summarize([_trace("a", 1.0, 0), _trace("a", None, 1)])
    assert summary.pass_at_k == {1: 1.0, 2: None} and summary.avg_at_k == {1: 1.0, 2: None}
    assert summary.tasks_at_k == {1: 1, 2: 0}
    assert "pass@2 / avg@2: - / - (0 tasks)" in summary_lines(summary)


def test_pass_threshold_decides_what_passes():
    traces = [_trace("a", 0.6, 0), _trace("a", 0.4, 1)]
    assert summarize(traces, pass_threshold=0.5).pass_at_k[1] == 0.5
    assert summarize(traces).pass_at_k[1] == 0.0


def test_tokens_and_truncation_are_totalled():
    traces = [
        _trace("a", usage=Usage(prompt_tokens=10, completion_tokens=4)),
        _trace("b", usage=Usage(prompt_tokens=20, completion_tokens=8), stop_reason=StopReason.TRUNCATED),
    ]
    summary = summarize(traces)
    assert (summary.prompt_tokens, summary.completion_tokens, summary.mean_completion_tokens) == (30, 12, 6.0)
    assert summary.truncation_rate == 0.5


def test_rollouts_per_second_comes_from_wall_time():
    summary = summarize([_trace("a"), _trace("b")], wall_time=4.0)
    assert summary.wall_time == 4.0 and summary.rollouts_per_second == 0.5


def test_rollouts_per_second_is_none_without_wall_time():
    assert summarize([_trace()]).rollouts_per_second is None


def test_no_traces_give_an_empty_summary():
    summary = summarize([])
    assert summary.num_traces == 0 and summary.reward is None and summary.pass_at_k == {}


def test_json_round_trip_is_lossless():
    traces = [_trace("a", 1.0, 0, metrics={"m": 1.0}), _trace("a", None, 1, error=ErrorKind.MODEL)]
    summary = summarize(traces, wall_time=2.0)
    assert Summary.model_validate_json(summary.model_dump_json()) == summary


def test_summary_lines_name_reward_and_pass_at_k():
    lines = summary_lines(summarize([_trace("a", 1.0, 0), _trace("a", 0.0, 1)], wall_time=1.0))
    assert "reward: 0.500 ± 0.980 (95% CI, std 0.707, n=2)" in lines
    assert "pass@2 / avg@2: 1.000 ± 0.000 / 0.500 ± 0.000 (1 task)" in lines


def test_the_reward_line_says_how_many_were_scored_when_not_all_were():
    lines = summary_lines(summarize([_trace("a", 1.0, 0), _trace("a", None, 1, error=ErrorKind.MODEL)]))
    assert "reward: 1.000 ± 0.000 (95% CI, std 0.000, 1 of 2 scored)" in lines


def test_summary_lines_show_the_intervals_and_the_tasks_behind_each_k():
    traces = [_trace("a", 1.0, 0), _trace("a", 0.0, 1), _trace("b", 0.0, 0), _trace("b", None, 1)]
    lines = summary_lines(summarize(traces))
    assert "pass@1 / avg@1: 0.250 ± 0.490 / 0.250 ± 0.490 (2 tasks)" in lines
    assert "pass@2 / avg@2: 1.000 ± 0.000 / 0.500 ± 0.000 (1 task)" in lines


def test_summary_table_renders_every_line():
    summary = summarize([_trace("a", 1.0, 0, error=ErrorKind.TOOL)], wall_time=1.0)
    console = Console(record=True, width=200)
    console.print(summary_table(summary, title="run"))
    text = console.export_text()
    assert "run" in text
    assert all(line.split(": ", 1)[0] in text for line in summary_lines(summary))
