"""The LM head's logprobs straight from hidden states: the same values and gradients as through full logits."""

import torch

from tracegym.train import lm_head
from tracegym.train.lm_head import head_logprobs
from tracegym.train.loss import token_logprobs


def case(temperatures: list[float]):
    """Hidden states of 2 rows x 7 positions, a 50-word head, and targets of which several share a position (a
    shared prompt's last one), some positions read by none."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 7, 8, generator=generator, requires_grad=True)
    weight = torch.randn(50, 8, generator=generator)
    sources = torch.tensor([[2, 2, 2, 3, 4], [0, 1, 1, 5, 6]])
    targets = torch.randint(0, 50, (2, 5), generator=generator)
    return hidden, weight, sources, targets, torch.tensor(temperatures)


def through_logits(hidden, weight, sources, targets, temperatures):
    return token_logprobs(hidden @ weight.T, sources, targets, temperatures)


def values_and_gradient(function, hidden, *rest):
    hidden.grad = None
    out = function(hidden, *rest)
    (out * torch.linspace(-1, 2, out.numel()).view_as(out)).sum().backward()
    return out.detach(), hidden.grad.clone()


def test_logprobs_and_their_gradient_match_the_full_logits_at_temperature_one():
    hidden, *rest = case([1.0, 1.0])
    ours, our_grad = values_and_gradient(head_logprobs, hidden, *rest)
    theirs, their_grad = values_and_gradient(through_logits, hidden, *rest)
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(our_grad, their_grad, atol=1e-5)


def test_logprobs_and_their_gradient_match_at_each_rows_temperature():
    hidden, *rest = case([0.7, 1.3])
    ours, our_grad = values_and_gradient(head_logprobs, hidden, *rest)
    theirs, their_grad = values_and_gradient(through_logits, hidden, *rest)
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.allclose(our_grad, their_grad, atol=1e-5)


def test_chunks_of_positions_give_the_same_logprobs(monkeypatch):
    hidden, *rest = case([0.7, 1.3])
    whole = head_logprobs(hidden, *rest)
    monkeypatch.setattr(lm_head, "CHUNK", 2)
    assert torch.allclose(head_logprobs(hidden, *rest), whole, atol=1e-6)


def test_positions_no_target_reads_get_no_gradient():
    hidden, *rest = case([1.0, 1.0])
    _, grad = values_and_gradient(head_logprobs, hidden, *rest)
    assert grad[0, [0, 1, 5, 6]].abs().sum() == 0 and grad[1, [2, 3, 4]].abs().sum() == 0
    assert grad[0, 2].abs().sum() > 0


def test_a_bfloat16_head_gives_the_logprobs_of_its_bfloat16_logits():
    """As a bfloat16 sampler's: logits rounded to bfloat16, then a float32 log-softmax; the gradient comes from a
    bfloat16 matmul, so it matches to bfloat16's precision."""
    hidden, weight, *rest = case([0.7, 1.3])
    hidden = hidden.detach().bfloat16().requires_grad_()
    ours, our_grad = values_and_gradient(head_logprobs, hidden, weight.bfloat16(), *rest)
    theirs, their_grad = values_and_gradient(through_logits, hidden, weight.bfloat16(), *rest)
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert torch.allclose(our_grad.float(), their_grad.float(), atol=2e-2, rtol=2e-2)
