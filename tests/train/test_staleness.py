"""Staleness control: when a step's batch may start, which samples it keeps, and the count of dropped ones."""

import pytest

from tracegym.core.errors import UsageError
from tracegym.core.sample import Sample
from tracegym.train.staleness import StalenessControl


def at(version: int | None) -> Sample:
    return Sample(token_ids=[1, 2], loss_mask=[False, True], logprobs=[0.0, -0.1], policy_version=version)


def test_on_policy_waits_for_the_trainer_to_reach_the_step():
    control = StalenessControl(max_async_steps=0)
    assert control.may_start(step=2, trainer_version=2)
    assert not control.may_start(step=3, trainer_version=2)


def test_the_orchestrator_runs_at_most_max_async_steps_ahead():
    control = StalenessControl(max_async_steps=2)
    assert control.may_start(step=4, trainer_version=2)
    assert not control.may_start(step=5, trainer_version=2)


def test_the_oldest_usable_version_trails_the_step_by_max_async_steps():
    control = StalenessControl(max_async_steps=2)
    assert [control.oldest_version(step) for step in range(5)] == [0, 0, 0, 1, 2]


def test_samples_too_stale_are_dropped_and_counted():
    control = StalenessControl(max_async_steps=1)
    kept = control.admit([at(3), at(4), at(2), at(5)], step=5)
    assert [s.policy_version for s in kept] == [4, 5]
    assert control.dropped == 2


def test_a_sample_without_a_policy_version_is_an_error():
    with pytest.raises(UsageError):
        StalenessControl().admit([at(None)], step=0)


def test_negative_max_async_steps_is_rejected():
    with pytest.raises(UsageError):
        StalenessControl(max_async_steps=-1)


def test_the_dropped_count_survives_a_checkpoint():
    control = StalenessControl(max_async_steps=0)
    control.admit([at(0)], step=1)
    restored = StalenessControl(max_async_steps=0)
    restored.load_state_dict(control.state_dict())
    assert restored.dropped == 1
