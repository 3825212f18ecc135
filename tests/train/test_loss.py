"""Loss: the policy-gradient loss and its gradient against hand-computed values; ratio masking; temperature."""

import math

import pytest
import torch

from tracegym.train.loss import LossConfig, policy_gradient_loss, token_logprobs

BOUND = LossConfig(min_ratio=0.5, max_ratio=1.5)


def _example():
    """Two rows, three tokens each. Row 0 (advantage +1): token 1 ratio 1, token 2 ratio 2 (above the bound).
    Row 1 (advantage -2): tokens 1 and 2 with ratios 1.25 and 0.25 (below the bound). Token 0 carries no loss."""
    trainer = torch.log(torch.tensor([[1.0, 0.5, 0.2], [1.0, 0.5, 0.1]])).requires_grad_()
    sampler = torch.log(torch.tensor([[1.0, 0.5, 0.1], [1.0, 0.4, 0.4]]))
    mask = torch.tensor([[False, True, True], [False, True, True]])
    return trainer, sampler, torch.tensor([1.0, -2.0]), mask


def test_loss_matches_the_hand_computed_value():
    trainer, sampler, adv, mask = _example()
    loss, _ = policy_gradient_loss(trainer, sampler, adv, mask, BOUND)
    # kept: row 0 token 1 (-1 * 1.0) and row 1 token 1 (+2 * 1.25); four loss tokens
    assert loss.item() == pytest.approx((-1.0 + 2.5) / 4)


def test_gradient_is_minus_advantage_times_ratio_over_tokens_and_zero_where_masked():
    trainer, sampler, adv, mask = _example()
    loss, _ = policy_gradient_loss(trainer, sampler, adv, mask, BOUND)
    loss.backward()
    expected = torch.tensor([[0.0, -1.0 * 1.0 / 4, 0.0], [0.0, 2.0 * 1.25 / 4, 0.0]])
    assert torch.allclose(trainer.grad, expected)


def test_stats_count_tokens_masked_above_and_below_the_bound():
    trainer, sampler, adv, mask = _example()
    _, stats = policy_gradient_loss(trainer, sampler, adv, mask, BOUND)
    assert (stats["tokens"], stats["masked_low"], stats["masked_high"]) == (4, 1, 1)
    assert stats["ratio"] == pytest.approx(1.0 + 1.25)


def test_the_step_token_count_normalises_the_loss():
    trainer, sampler, adv, mask = _example()
    loss, _ = policy_gradient_loss(trainer, sampler, adv, mask, BOUND, num_tokens=8)
    assert loss.item() == pytest.approx((-1.0 + 2.5) / 8)


def test_on_policy_gradient_is_reinforce():
    logprobs = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    loss, _ = policy_gradient_loss(logprobs, logprobs.detach(), torch.tensor([0.5]), torch.tensor([[True, True]]))
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.25, -0.25]]))


def test_an_enormous_ratio_is_masked_without_nan():
    logprobs = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = policy_gradient_loss(logprobs, torch.tensor([[-1000.0]]), torch.tensor([1.0]), torch.tensor([[True]]))
    loss.backward()
    assert loss.item() == 0.0 and logprobs.grad.item() == 0.0


def test_token_logprobs_divide_logits_by_the_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    at_two = token_logprobs(logits, torch.tensor([[0]]), torch.tensor([[0]]), torch.tensor([2.0]))
    assert at_two.item() == pytest.approx(1.0 - math.log(math.e + 1.0))


def test_token_logprobs_read_each_target_from_its_source_position():
    logits = torch.log_softmax(torch.randn(1, 3, 5), dim=-1)
    pairs = [(2, 4), (0, 1), (0, 3), (1, 0)]  # position 0 predicts two targets
    sources, targets = torch.tensor([[s for s, _ in pairs]]), torch.tensor([[t for _, t in pairs]])
    got = token_logprobs(logits, sources, targets, torch.tensor([1.0]))
    assert torch.allclose(got[0], torch.stack([logits[0, s, t] for s, t in pairs]))


def test_per_token_advantages_weigh_each_token_by_its_own():
    trainer, sampler, _, mask = _example()
    per_token = torch.tensor([[0.0, 3.0, 1.0], [0.0, -0.5, 4.0]])
    loss, _ = policy_gradient_loss(trainer, sampler, per_token, mask, BOUND)
    # kept: row 0 token 1 (-3 * 1.0) and row 1 token 1 (+0.5 * 1.25); the masked tokens' advantages do not count
    assert loss.item() == pytest.approx((-3.0 + 0.625) / 4)
