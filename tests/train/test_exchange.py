"""The orchestrator/trainer exchange: batches and policy versions through the run folder."""

import pytest

import tracegym as tg
from tracegym.core.sample import Sample
from tracegym.train import exchange


def _sample(advantage: float) -> Sample:
    return Sample(token_ids=[1, 2, 3], loss_mask=[False, True, True], logprobs=[0.0, -0.5, -0.7],
                  advantage=advantage, policy_version=0)


def test_a_written_batch_reads_back_equal(tmp_path):
    samples = [_sample(1.0), _sample(-1.0)]
    exchange.write_batch(tmp_path, 3, samples, {"reward": 0.5})
    assert exchange.read_batch(tmp_path, 3) == (samples, {"reward": 0.5})


def test_a_batch_not_yet_written_reads_as_none(tmp_path):
    assert exchange.read_batch(tmp_path, 0) is None


def test_before_any_step_the_base_model_is_served_as_version_0(tmp_path):
    assert exchange.current_policy(tmp_path, "base") == (0, "base")


def test_a_published_policy_is_current(tmp_path):
    exchange.publish_policy(tmp_path, 4, "policy")
    assert exchange.current_policy(tmp_path, "base") == (4, "policy")


def test_waiting_gives_up_when_the_other_side_is_gone(tmp_path):
    with pytest.raises(tg.InfrastructureError, match="gone"):
        exchange.wait_for(lambda: None, "a batch", timeout=5, alive=lambda: False)


def test_waiting_gives_up_after_the_timeout(tmp_path):
    with pytest.raises(tg.InfrastructureError, match="after"):
        exchange.wait_for(lambda: None, "a batch", timeout=0.1)
