"""Loss: token-level policy gradient with the importance ratio between trainer and sampler, masked outside a bound.

For every token that carries loss, `ratio = exp(trainer_logprob - sampler_logprob)` corrects for the sampler
having been a different policy (older weights, other numerics: vLLM in bfloat16, the trainer in float32). The
token's loss is `-advantage * ratio`, whose gradient is `-advantage * ratio * grad(trainer_logprob)`:
REINFORCE with importance weights. A token whose ratio left `[min_ratio, max_ratio]` is masked (no gradient,
not clipped): its sample is too far from the current policy to say anything reliable. The sum is divided by
the number of loss tokens in the whole step (masked ones included), so every token weighs the same whatever
micro-batch it landed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    """The ratio bound of the policy-gradient loss."""

    min_ratio: float = 0.125
    """Tokens whose trainer/sampler probability ratio is below this are masked."""
    max_ratio: float = 8.0
    """Tokens whose ratio is above this are masked."""


def token_logprobs(logits: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor,
                   temperatures: torch.Tensor) -> torch.Tensor:
    """[B, K] logprob of each target token under `logits[b, sources[b, k]] / temperature[b]` ([B, S, V] logits,
    [B, K] source positions and target ids, [B] temperatures).

    Computed as `logit[target] - logsumexp(logits)`, with one logsumexp per position whatever number of targets it
    predicts (a shared prompt's last position predicts every sample's first token), and no [B, K, V] tensor.
    """
    scaled = logits.float()
    if bool((temperatures != 1.0).any()):  # at temperature 1 the division would only copy [B, S, V] logits
        scaled = scaled / temperatures.to(logits.device, torch.float32)[:, None, None]
    picked = scaled.flatten(1).gather(1, sources * scaled.shape[-1] + targets)
    return picked - torch.logsumexp(scaled, dim=-1).gather(1, sources)


def policy_gradient_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig = LossConfig(),
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch ([B, K] tensors; advantages [B] per row or [B, K] per token) and its sums for
    metrics.

    `num_tokens` is the number of loss tokens in the whole step (default: this micro-batch's). The sums:
    `tokens`, `masked_low`, `masked_high`, `ratio` (over unmasked tokens), `abs_log_ratio` (over all tokens).
    """
    loss_mask = loss_mask.bool()
    log_ratio = logprobs - sampler_logprobs
    with torch.no_grad():
        low = loss_mask & (log_ratio < math.log(config.min_ratio))
        high = loss_mask & (log_ratio > math.log(config.max_ratio))
        kept = loss_mask & ~low & ~high
    ratio = torch.exp(torch.where(kept, log_ratio, torch.zeros_like(log_ratio)))  # no exp() of huge ratios
    per_row = advantages.dim() == 1
    per_token = torch.where(kept, -(advantages[:, None] if per_row else advantages) * ratio, torch.zeros_like(ratio))
    denominator = num_tokens if num_tokens is not None else int(loss_mask.sum())
    loss = per_token.sum() / max(denominator, 1)
    with torch.no_grad():
        stats = {
            "tokens": float(loss_mask.sum()),
            "masked_low": float(low.sum()),
            "masked_high": float(high.sum()),
            "ratio": float(ratio[kept].sum()),
            "abs_log_ratio": float(log_ratio[loss_mask].abs().sum()),
        }
    return loss, stats


def cross_entropy_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, num_tokens: int | None = None,
                       hits: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood of the loss tokens of one micro-batch ([B, K] tensors), divided by the
    step's loss tokens (`num_tokens`, default this micro-batch's) so every token weighs the same, and its sums
    for metrics: `tokens`, and with `hits` ([B, K] bool: `token_hits`) `correct`, the loss tokens that are
    their position's most likely token. The policy-gradient loss's counterpart."""
    mask = loss_mask.bool()
    denominator = num_tokens if num_tokens is not None else int(mask.sum())
    loss = torch.where(mask, -logprobs, torch.zeros_like(logprobs)).sum() / max(denominator, 1)
    stats = {"tokens": float(mask.sum())}
    if hits is not None:
        stats["correct"] = float((hits & mask).sum())
    return loss, stats


def token_hits(logits: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[B, K] whether each target token is the most likely one under `logits[b, sources[b, k]]` (what greedy
    decoding would emit there; any temperature leaves it the same)."""
    return logits.detach().argmax(-1).gather(1, sources) == targets
