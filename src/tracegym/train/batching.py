"""Micro-batches: training samples packed by a token budget and collated into left-padded tensors.

Padding, not concatenation: packing several samples into one row with restarting position ids only isolates
them under attention kernels that read sequence boundaries (flash-attention's varlen path); with SDPA or eager
attention on CPU the samples would attend to each other. Padding with an attention mask is exact on every
backend. The padding is kept small by sorting samples by length before cutting micro-batches, and the
budget counts padded tokens (rows x longest row), which is what memory and compute scale with.

Left padding puts every row's completion at the right edge, so the trainer asks the model for logits of only
the last `keep` positions (`logits_to_keep`) instead of the whole sequence times a 49k-word vocabulary.

With several trainer ranks, `balance` first deals the step's samples out so every rank gets about as many tokens
(what its compute scales with); each rank then packs its share. A rank with fewer micro-batches than the others
runs `idle` ones (no loss tokens), since every rank must take part in each forward and backward of a sharded model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from tracegym.core.sample import Sample


def pack(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Cut samples (longest first) into micro-batches whose padded size `rows * longest` fits `token_budget`.

    A sample longer than the budget gets a micro-batch of its own. Every sample lands in exactly one batch.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    for sample in sorted(samples, key=len, reverse=True):
        longest = len(current[0]) if current else len(sample)
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        current.append(sample)
    if current:
        batches.append(current)
    return batches


def balance(samples: Sequence[Sample], ranks: int) -> list[list[Sample]]:
    """Deal `samples` out to `ranks` shares of about equal tokens: longest first, each to the share with the fewest
    tokens so far (ties: the lowest rank). Deterministic, so every rank computes the same split of the same batch;
    with fewer samples than ranks some shares are empty."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    shares: list[list[Sample]] = [[] for _ in range(ranks)]
    tokens = [0] * ranks
    for sample in sorted(samples, key=len, reverse=True):
        rank = min(range(ranks), key=lambda r: (tokens[r], r))
        shares[rank].append(sample)
        tokens[rank] += len(sample)
    return shares


@dataclass(frozen=True)
class MicroBatch:
    """Left-padded tensors of some samples; row `b`, column `t` is token `t` of the padded row."""

    input_ids: torch.Tensor
    """[B, T] token ids, padded on the left."""
    attention_mask: torch.Tensor
    """[B, T] 1 for real tokens, 0 for padding."""
    position_ids: torch.Tensor
    """[B, T] positions counted from each row's first real token (0 on padding)."""
    loss_mask: torch.Tensor
    """[B, T] True for tokens that carry loss (never column 0: no logits predict it)."""
    sampler_logprobs: torch.Tensor
    """[B, T] the sampler's logprob of each token (0 where no loss)."""
    advantages: torch.Tensor
    """[B, T] the advantage of each token (a sample's `token_advantages`, else its `advantage` on every token)."""
    temperatures: torch.Tensor
    """[B] the sampling temperature of each row."""
    keep: int
    """Logits are needed for the last `keep` positions only; they predict the last `keep - 1` tokens."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def targets(self) -> slice:
        """Columns of the tokens predicted by the kept logits (all but the last)."""
        return slice(self.input_ids.shape[1] - self.keep + 1, None)

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on `device`."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "keep"}
        return MicroBatch(**moved, keep=self.keep)


def collate(samples: Sequence[Sample], pad_id: int = 0) -> MicroBatch:
    """Left-pad `samples` into one MicroBatch (loss on a sample's first token is dropped: nothing predicts it)."""
    width = max(len(s) for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    positions = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width), dtype=torch.bool)
    logprobs = torch.zeros((rows, width), dtype=torch.float32)
    advantages = torch.zeros((rows, width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        n, start = len(sample), width - len(sample)
        input_ids[row, start:] = torch.tensor(sample.token_ids, dtype=torch.long)
        attention[row, start:] = 1
        positions[row, start:] = torch.arange(n)
        loss_mask[row, start:] = torch.tensor(sample.loss_mask, dtype=torch.bool)
        loss_mask[row, start] = False
        logprobs[row, start:] = torch.tensor(sample.logprobs, dtype=torch.float32)
        per_token = sample.token_advantages
        advantages[row, start:] = torch.tensor(per_token, dtype=torch.float32) if per_token else sample.advantage
    first_loss = int(loss_mask.any(0).nonzero().min()) if loss_mask.any() else width - 1
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        loss_mask=loss_mask,
        sampler_logprobs=logprobs,
        advantages=advantages,
        temperatures=torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        keep=width - first_loss + 1,
    )


def idle(pad_id: int = 0) -> MicroBatch:
    """A micro-batch that carries no loss: what a rank runs while others still have micro-batches to train."""
    return collate([Sample(token_ids=[pad_id, pad_id], loss_mask=[False, False], logprobs=[0.0, 0.0])], pad_id)
