"""The verdict of a finished run: which of its rollouts or episodes count as failed, against --max-error-rate."""

from tracegym.core.errors import ErrorKind, TraceError
from tracegym.eval.episode_summary import EpisodeSummary, summarize_episodes
from tracegym.eval.run_summary import failed, too_many_failed
from tracegym.eval.summary import summarize
from tracegym.testing import make_trace
from tracegym.testing.episodes import make_episode


def test_a_rollout_of_a_taskset_without_rewards_is_not_a_failure():
    trace = make_trace()
    trace.rewards = {}
    assert failed(summarize([trace])) == (0, 1)


def test_a_rollout_that_errored_or_left_its_reward_unscored_is_a_failure():
    traces = [make_trace(reward=None, error=ErrorKind.MODEL), make_trace(reward=None), make_trace(reward=1.0)]
    assert failed(summarize(traces)) == (2, 3)


def test_episodes_whose_rewards_were_never_decided_are_failures():
    summary = EpisodeSummary(num_episodes=4, num_ok=0)
    assert failed(summary) == (4, 4)
    assert "4 of 4 episodes failed" in (too_many_failed(summary, 0.5) or "")


def test_a_failure_rate_at_the_threshold_passes():
    assert too_many_failed(EpisodeSummary(num_episodes=4, num_ok=2), 0.5) is None


def test_an_episode_whose_reward_raised_counts_its_error_and_ends_unscored():
    crashed = make_episode({"a": None, "b": None})
    for member in crashed.members:
        crashed.traces[member].errors.append(TraceError(kind=ErrorKind.TASK, stage="scoring:win", message="boom"))
    summary = summarize_episodes([crashed, make_episode({"a": 1.0, "b": -1.0})])
    assert (summary.errors_by_kind, summary.unscored_episodes, summary.num_ok) == ({"task": 1}, 1, 1)
    assert summary.failures == {crashed.traces["a"].errors[0].failure.value: 1}


def test_an_episode_ended_by_an_error_counts_it_once_not_per_member_copy():
    ended = make_episode({"a": None, "b": None}, error=TraceError(kind=ErrorKind.MODEL, stage="turn", message="x"))
    for member in ended.members:
        ended.traces[member].errors.append(ended.error.model_copy(update={"stage": "episode:turn"}))
    assert summarize_episodes([ended]).errors_by_kind == {"model": 1}
