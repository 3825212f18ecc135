"""Micro-batches: packing by a padded token budget, and left-padded collation with aligned masks."""

import torch

from tracegym.core.sample import Sample
from tracegym.train.batching import collate, pack


def sample(n: int, completion: int = 2, advantage: float = 0.0, temperature: float = 1.0) -> Sample:
    """`n` tokens (ids 1..n), the last `completion` of them sampled with logprob -0.5."""
    mask = [False] * (n - completion) + [True] * completion
    return Sample(token_ids=list(range(1, n + 1)), loss_mask=mask, logprobs=[-0.5 if m else 0.0 for m in mask],
                  advantage=advantage, temperature=temperature)


def test_every_sample_lands_in_exactly_one_micro_batch():
    samples = [sample(n) for n in (5, 9, 3, 7, 4)]
    batches = pack(samples, token_budget=16)
    assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)


def test_padded_size_of_each_micro_batch_fits_the_budget():
    batches = pack([sample(n) for n in (5, 9, 3, 7, 4, 8, 2)], token_budget=16)
    assert all(len(b) * max(len(s) for s in b) <= 16 for b in batches)


def test_samples_are_grouped_longest_first_to_keep_padding_small():
    batches = pack([sample(n) for n in (3, 8, 4, 7)], token_budget=16)
    assert [[len(s) for s in b] for b in batches] == [[8, 7], [4, 3]]


def test_a_sample_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    batches = pack([sample(3), sample(20), sample(3)], token_budget=10)
    assert [[len(s) for s in b] for b in batches] == [[20], [3, 3]]


def test_collate_pads_on_the_left_with_attention_mask_and_positions():
    batch = collate([sample(4), sample(2)], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [0, 0, 1, 2]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]


def test_collate_never_puts_loss_on_a_rows_first_token():
    batch = collate([sample(4), sample(2)])
    assert batch.loss_mask.tolist() == [[False, False, True, True], [False, False, False, True]]


def test_collate_keeps_logits_from_the_position_before_the_first_loss_token():
    batch = collate([sample(6, completion=2), sample(5, completion=3)])
    # columns 0..5; the first loss token is column 3 (row 1: padded by 1, completion starts at its token 2)
    assert batch.keep == 6 - 3 + 1
    assert batch.input_ids[:, batch.targets].shape == (2, batch.keep - 1)


def test_collate_carries_advantages_temperatures_and_sampler_logprobs():
    batch = collate([sample(3, advantage=0.5, temperature=0.7), sample(3, advantage=-1.0)])
    assert batch.advantages.tolist() == [[0.5] * 3, [-1.0] * 3]  # one per token: each row's advantage throughout
    assert torch.allclose(batch.temperatures, torch.tensor([0.7, 1.0]))
    assert batch.sampler_logprobs[0].tolist() == [0.0, -0.5, -0.5]


def test_collate_carries_per_token_advantages_where_a_sample_has_them():
    distilled = sample(3).model_copy(update={"token_advantages": [0.0, 0.25, -0.75]})
    batch = collate([sample(4, advantage=2.0), distilled])
    assert batch.advantages.tolist() == [[2.0] * 4, [0.0, 0.0, 0.25, -0.75]]  # row 1 left-padded by one
