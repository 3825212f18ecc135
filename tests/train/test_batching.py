"""Micro-batches: rows sharing a prompt, packing by a padded token budget, left-padded collation of targets."""

import torch

from tracegym.core.sample import Sample
from tracegym.train.batching import Row, collate, pack, rows


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
    lone = sample(2, completion=2)  # its token 0 carries loss in the sample; nothing predicts it
    batch = collate([sample(4), lone])
    assert batch.target_ids.tolist() == [[3, 4], [2, 0]]
    assert batch.loss_mask.tolist() == [[True, True], [True, False]]


def test_collate_keeps_logits_from_the_position_before_the_first_loss_token():
    batch = collate([sample(6, completion=2), sample(5, completion=3)])
    # columns 0..5; the first loss token is column 3 (row 1: padded by 1, completion starts at its token 2)
    assert batch.keep == 6 - 3 + 1
    assert batch.sources.tolist() == [[1, 2, 0], [0, 1, 2]]  # row 0's targets are its tokens 5, 6 (columns 4, 5)


def test_collate_carries_advantages_temperatures_and_sampler_logprobs():
    batch = collate([sample(3, advantage=0.5, temperature=0.7), sample(3, advantage=-1.0)])
    assert batch.advantages.tolist() == [[0.5] * 2, [-1.0] * 2]  # one per target: each row's advantage throughout
    assert torch.allclose(batch.temperatures, torch.tensor([0.7, 1.0]))
    assert batch.sampler_logprobs[0].tolist() == [-0.5, -0.5]


def test_collate_carries_per_token_advantages_where_a_sample_has_them():
    distilled = sample(3).model_copy(update={"token_advantages": [0.0, 0.25, -0.75]})
    batch = collate([sample(4, advantage=2.0), distilled])
    assert batch.advantages.tolist() == [[2.0, 2.0], [0.25, -0.75]]


def rollouts(prompt: list[int], *completions: list[int], temperature: float = 1.0) -> list[Sample]:
    """A group's samples: the same prompt, each its own completion (logprob -0.5 per sampled token)."""
    return [Sample(token_ids=prompt + c, loss_mask=[False] * len(prompt) + [True] * len(c),
                   logprobs=[0.0] * len(prompt) + [-0.5] * len(c), temperature=temperature) for c in completions]


def test_samples_with_the_same_prompt_share_a_row():
    group = rollouts([1, 2, 3], [4, 5], [6, 7, 8])
    (row,) = rows(group, token_budget=64)
    assert row.samples == tuple(group) and row.shared == 3 and len(row) == 3 + 2 + 3


def test_another_prompt_or_temperature_gets_a_row_of_its_own():
    group = rollouts([1, 2, 3], [4, 5], [6, 7])
    other = [*rollouts([1, 2, 9], [4, 5]), *rollouts([1, 2, 3], [4, 5], temperature=0.5)]
    laid_out = rows([*group, *other], token_budget=64)
    assert sorted(len(r.samples) for r in laid_out) == [1, 1, 2]


def test_a_shared_row_is_cut_to_fit_the_budget():
    group = rollouts([1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12])
    assert [len(r) for r in rows(group, token_budget=9)] == [9, 6]


def test_sharing_off_gives_a_row_per_sample():
    group = rollouts([1, 2, 3], [4, 5], [6, 7])
    assert [r.shared for r in rows(group, token_budget=64, share=False)] == [5, 5]


def test_a_shared_row_holds_the_prompt_once_with_positions_restarting_after_it():
    (row,) = rows(rollouts([1, 2, 3], [4, 5], [6, 7, 8]), token_budget=64)
    batch = collate([row])
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5]]


def test_a_shared_rows_samples_see_the_prompt_and_themselves_only():
    (row,) = rows(rollouts([1, 2], [3, 4], [5, 6]), token_budget=64)
    mask = collate([row]).attention_mask[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 0, 0],
                    [1, 1, 0, 0, 1, 0],   # the second sample's first token: the prompt and itself
                    [1, 1, 0, 0, 1, 1]]


def test_each_samples_first_target_is_predicted_by_the_prompts_last_position():
    (row,) = rows(rollouts([1, 2], [3, 4], [5, 6]), token_budget=64)
    batch = collate([row])
    assert batch.target_ids.tolist() == [[3, 4, 5, 6]]
    assert (batch.sources + 6 - batch.keep).tolist() == [[1, 2, 1, 4]]  # padded positions of the tokens before


def test_padding_in_a_shared_micro_batch_attends_to_itself_only():
    (row,) = rows(rollouts([1, 2], [3, 4], [5, 6]), token_budget=64)
    mask = collate([row, Row.alone(sample(3))]).attention_mask[1, 0].int()
    assert mask[:3, :3].tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]  # three padding positions


def test_a_sample_without_loss_tokens_gets_a_row_and_no_targets():
    silent = Sample(token_ids=[1, 2, 3], loss_mask=[False] * 3, logprobs=[0.0] * 3)
    laid_out = rows([silent, *rollouts([1, 2, 3], [4, 5], [6, 7])], token_budget=64)
    assert sorted(len(r.samples) for r in laid_out) == [1, 2]
    (span,) = [s for s in collate(laid_out).spans if s.sample is silent]
    assert span.count == 0
