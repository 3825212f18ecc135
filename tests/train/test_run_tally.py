"""The run tally: an RL run's step records add up to its rollouts, failures by kind, scored count and mean reward,
over the whole run (empty attempts included, a step re-made after a resume once)."""

import doctest

from tracegym.core.errors import ErrorKind
from tracegym.testing import make_episode, make_trace
from tracegym.train import run_tally
from tracegym.train.orchestrator import step_metrics
from tracegym.train.run_tally import RunTally


def step_record(step: int, rewards: list[float | None], **extra) -> dict:
    """A step's record as the orchestrator writes it, from rollouts with these rewards (None: failed, endpoint
    down)."""
    traces = [make_trace(reward=r) if r is not None else make_trace(reward=None, error=ErrorKind.INFRASTRUCTURE)
              for r in rewards]
    return {"step": step, **step_metrics([traces], [], 1.0), **extra}


def test_the_modules_doctest_runs():
    assert doctest.testmod(run_tally).failed == 0


def test_every_rollout_of_the_run_counts_and_the_reward_is_the_mean_of_the_scored_ones():
    tally = RunTally.of([step_record(0, [1.0, 0.0, None]), step_record(1, [1.0, 1.0, 1.0, None])])
    assert (tally.steps, tally.rollouts, tally.scored) == (2, 7, 5)
    assert tally.failed == {"model_unavailable": 2}
    assert tally.reward == 4 / 5


def test_an_empty_attempts_rollouts_count_and_held_out_records_do_not():
    empty = {"empty_batch": 0, "attempt": 0, **step_record(0, [None, 0.0])}
    del empty["step"]
    held_out = {"eval_step": 0, "env": "x", "eval_reward": 1.0, "eval_n": 32}
    tally = RunTally.of([empty, held_out, step_record(0, [1.0, 0.0])])
    assert (tally.steps, tally.rollouts, tally.scored) == (1, 4, 3)


def test_a_step_made_again_after_a_resume_counts_once():
    tally = RunTally.of([step_record(0, [None, None, 1.0]), step_record(0, [1.0, 0.0, 1.0])])
    assert (tally.rollouts, tally.scored) == (3, 3)


def test_the_headline_says_all_scored_when_none_failed():
    assert RunTally.of([step_record(0, [1.0, 0.0])]).headline() == "1 step, 2 rollouts, all scored; reward 0.500"


def test_the_headline_says_n_of_m_scored_and_the_failure_kinds_when_some_failed():
    headline = RunTally.of([step_record(0, [1.0, None]), step_record(1, [1.0, 1.0])]).headline()
    assert headline == "2 steps, 3 of 4 rollouts scored (1 failed: model_unavailable 1); reward 1.000"


def test_more_failed_than_max_error_rate_is_one_line_with_evals_wording():
    tally = RunTally.of([step_record(0, [1.0, None, None])])
    assert tally.too_many_failed(0.5) == "2 of 3 rollouts failed (67%), more than --max-error-rate 0.5 allows"
    assert tally.too_many_failed(0.7) is None


def test_lost_multi_agent_episodes_count_against_max_error_rate():
    """Episodes lost whole leave no learner trace: the rollouts all scored, but 3 of 4 episodes failed."""
    games = [make_episode({"p0": 1.0, "p1": -1.0})]
    record = {"step": 0, **step_metrics([[t for e in games for t in e.traces.values()]], [], 1.0),
              "episodes": 4, "episode_errors": 3}
    tally = RunTally.of([record])
    assert tally.too_many_failed(0.5) == "3 of 4 episodes failed (75%), more than --max-error-rate 0.5 allows"
    assert tally.headline().endswith("all scored; 3 of 4 episodes failed; reward 0.000")
