"""LM head: target-token logprobs straight from the last hidden states through a frozen output embedding, with no
[positions, vocabulary] logits kept for the backward.

A target's logprob is `h . W[y] / T - logsumexp(h W^T / T)`; its gradient with respect to `h` is
`(W[y] - E_p[W]) / T`, where `E_p[W] = softmax(h W^T / T) W` is one H-wide vector per position, whatever number of
targets the position predicts. The forward computes that vector chunk by chunk, while each chunk's logits are at
hand, and keeps it instead of the logits: the backward's LM-head matmul moves into the forward (the same work) and
the peak memory of a step loses the logits, their softmax and their gradient (SmolLM2-135M, 460 positions: 90 MB
each, `benchmarks/trainer_step.py`). Only the positions some target is read from go through the head, so
padding costs nothing here.

The head computes in its weight's dtype. A bfloat16 head's logits are rounded to bfloat16, as a bfloat16 vLLM's are,
then taken to float32 for the log-softmax (a target's logit is rounded the same way); its expected embedding is a
bfloat16 matmul of float32 probabilities rounded to bfloat16.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 128
"""Positions per chunk of logits (128 x 49k-word vocabulary: 25 MB of float32)."""


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
                  temperatures: torch.Tensor) -> torch.Tensor:
    """[B, K] logprob of each target token under `hidden[b, sources[b, k]] @ weight.T / temperatures[b]` ([B, S, H]
    hidden states, [V, H] frozen output embedding, [B, K] source positions and target ids, [B] temperatures); equal
    to `loss.token_logprobs` of the logits. Differentiable with respect to `hidden` only."""
    batch, length, _ = hidden.shape
    flat = sources + torch.arange(batch, device=sources.device)[:, None] * length
    positions, inverse = torch.unique(flat.flatten(), return_inverse=True)
    inv_temp = (1.0 / temperatures.to(hidden.device, torch.float32))[positions // length]
    picked = _HeadLogprobs.apply(hidden.flatten(0, 1), weight, positions, inverse, targets.flatten(), inv_temp)
    return picked.view_as(targets)


class _HeadLogprobs(torch.autograd.Function):
    """The head over the `positions` (unique flat indices) that targets are read from; `inverse` maps each
    target to its position's row."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                inverse: torch.Tensor, targets: torch.Tensor, inv_temp: torch.Tensor) -> torch.Tensor:
        states = hidden[positions].to(weight.dtype)
        expected, lse = _expected_embedding(states, weight, inv_temp)
        target_logits = (states[inverse].float() * weight[targets].float()).sum(-1).to(weight.dtype).float()
        picked = target_logits * inv_temp[inverse] - lse[inverse]
        ctx.save_for_backward(expected, positions, inverse, targets, inv_temp, weight)
        ctx.shape, ctx.dtype = hidden.shape, hidden.dtype
        return picked

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        expected, positions, inverse, targets, inv_temp, weight = ctx.saved_tensors
        per_target = (weight[targets].float() - expected[inverse]) * (grad * inv_temp[inverse])[:, None]
        per_position = torch.zeros_like(expected).index_add_(0, inverse, per_target)
        out = torch.zeros(ctx.shape, dtype=ctx.dtype, device=expected.device)
        out[positions] = per_position.to(ctx.dtype)
        return out, None, None, None, None, None


def _expected_embedding(states: torch.Tensor, weight: torch.Tensor, inv_temp: torch.Tensor,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: `softmax(logits) @ weight` ([P, H]) and `logsumexp(logits)` ([P]), `logits = states @ W^T
    * inv_temp`, a chunk of positions at a time; float32 out of matmuls in the weight's dtype."""
    expected = torch.empty(states.shape, dtype=torch.float32, device=states.device)
    lse = torch.empty(states.shape[0], dtype=torch.float32, device=states.device)
    scaled = bool((inv_temp != 1.0).any())
    for start in range(0, states.shape[0], CHUNK):
        end = min(start + CHUNK, states.shape[0])
        logits = (states[start:end] @ weight.T).float()
        if scaled:
            logits.mul_(inv_temp[start:end, None])
        lse[start:end] = torch.logsumexp(logits, dim=-1)
        probs = logits.sub_(lse[start:end, None]).exp_()
        if weight.dtype == torch.float32:
            torch.mm(probs, weight, out=expected[start:end])
        else:
            expected[start:end] = probs.to(weight.dtype) @ weight
    return expected, lse


@torch.no_grad()
def head_hits(hidden: torch.Tensor, weight: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
              ) -> torch.Tensor:
    """[B, K] whether each target token is the most likely one under `hidden[b, sources[b, k]] @ weight.T`
    (`loss.token_hits` of the logits), a chunk of positions at a time."""
    batch, length, _ = hidden.shape
    flat = sources + torch.arange(batch, device=sources.device)[:, None] * length
    positions, inverse = torch.unique(flat.flatten(), return_inverse=True)
    states = hidden.detach().flatten(0, 1)[positions].to(weight.dtype)
    best = torch.empty(states.shape[0], dtype=torch.long, device=states.device)
    for start in range(0, states.shape[0], CHUNK):
        best[start:start + CHUNK] = (states[start:start + CHUNK] @ weight.T).argmax(-1)
    return (best[inverse] == targets.flatten()).view_as(targets)
