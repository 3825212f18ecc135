"""Expert replay: the forcing hook, routing carried from the graph into samples and micro-batches, and the trainer's
logprobs matching a sampler whose routing differs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tracegym.core.errors import UsageError
from tracegym.core.graph import MessageGraph
from tracegym.core.messages import assistant, user
from tracegym.core.sample import Sample
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.models.expert_routing import forced_routing, routers
from tracegym.testing.moe import sampled, tiny_moe
from tracegym.train.batching import collate, rows
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import TrainerConfig, make_trainer

LAYERS, EXPERTS, TOP_K = 2, 8, 2


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_moe(seed=0, layers=LAYERS, experts=EXPERTS, top_k=TOP_K)


def _experts_seen(model: Any, routing: torch.Tensor, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(indices, weights) each MoE layer's experts module was called with, under `forced_routing`."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    blocks = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
    handles = [b.register_forward_pre_hook(lambda _m, args: seen.append((args[1], args[2]))) for b in blocks]
    try:
        with torch.no_grad(), forced_routing(model, routing):
            model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_forced_routing_sends_each_position_to_the_recorded_experts(model: Any) -> None:
    ids = torch.randint(0, 64, (2, 5))
    routing = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(2 * 5 * LAYERS)]).view(2, 5, LAYERS, TOP_K)
    seen = _experts_seen(model, routing, ids)
    assert [indices.tolist() for indices, _ in seen] == [routing[:, :, layer].reshape(-1, TOP_K).tolist()
                                                         for layer in range(LAYERS)]


def test_forced_experts_are_weighed_by_the_routers_softmax_over_them(model: Any) -> None:
    ids = torch.randint(0, 64, (1, 4))
    routing = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(4 * LAYERS)]).view(1, 4, LAYERS, TOP_K)
    logits: list[torch.Tensor] = []
    handle = routers(model)[0].register_forward_hook(lambda _m, _a, out: logits.append(out[0]))
    try:
        (_, weights), _ = _experts_seen(model, routing, ids)
    finally:
        handle.remove()
    probs = torch.softmax(logits[0].float(), dim=-1).gather(-1, routing[0, :, 0])
    torch.testing.assert_close(weights, probs / probs.sum(-1, keepdim=True))


def test_positions_recorded_as_minus_one_keep_the_routers_choice(model: Any) -> None:
    ids = torch.randint(0, 64, (1, 6))
    free = torch.full((1, 6, LAYERS, TOP_K), -1)
    with torch.no_grad():
        expected = [i.tolist() for i, _ in _experts_seen(model, free, ids)]
        routing = free.clone()
        routing[0, 2] = torch.tensor([[0, 1]] * LAYERS)
        forced = [i.tolist() for i, _ in _experts_seen(model, routing, ids)]
    for layer in range(LAYERS):
        assert forced[layer][2] == [0, 1]
        assert forced[layer][:2] + forced[layer][3:] == expected[layer][:2] + expected[layer][3:]


def test_a_routing_record_for_another_layer_count_is_refused_by_name(model: Any) -> None:
    with pytest.raises(UsageError, match="routed_experts name 3 MoE layers and the model has 2"), \
            forced_routing(model, torch.zeros((1, 2, 3, TOP_K), dtype=torch.long)):
        pass


def test_replay_makes_the_trainers_logprobs_equal_a_sampler_whose_routing_differs(model: Any) -> None:
    token_ids = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    logprobs, routing = sampled(model, token_ids, scale=0.5)
    mask = [False] * 8 + [True] * 40
    kept = [lp if m else 0.0 for lp, m in zip(logprobs, mask, strict=True)]
    sample = Sample(token_ids=token_ids, loss_mask=mask, logprobs=kept)
    trainer = make_trainer(model, TrainerConfig(model="tiny-moe", lora=False, compute_dtype="float32"))
    free, replayed = trainer.logprobs([sample, sample.model_copy(update={"routed_experts": routing})])
    with torch.no_grad():
        own = [i.tolist() for i, _ in _experts_seen(model, torch.full((1, 48, LAYERS, TOP_K), -1),
                                                    torch.tensor([token_ids]))]
    differs = sum(sorted(own[layer][t]) != sorted(routing[t][layer]) for t in range(48) for layer in range(LAYERS))
    gap = [abs(a - b) for a, b, m in zip(free, sample.logprobs, mask, strict=True) if m]
    assert differs > 0 and max(gap) > 1e-3
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(sample.logprobs), atol=1e-5, rtol=0)


def test_a_branchs_samples_carry_each_turns_routing_with_unforwarded_tokens_empty() -> None:
    trace = Trace(task=TaskData(prompt="q"), taskset="t")
    trace.graph.add(user("q"))
    call = [[[t, t + 1]] for t in range(4)]  # prompt 3 tokens + completion 2: 4 forwarded
    trace.graph.add_model_turn(assistant("a"), [1, 2, 3], [4, 5], [-0.1, -0.2], temperature=1.0,
                               routed_experts=call)
    (sample,) = trace_samples(trace)
    assert sample.routed_experts == [*call, []]


def test_an_extended_branchs_turn_keeps_only_its_new_tokens_routing() -> None:
    graph = MessageGraph()
    graph.add(user("q"))
    graph.add_model_turn(assistant("a"), [1, 2], [3], [-0.1], temperature=1.0, routed_experts=[[[0, 1]], [[1, 2]]])
    node = graph.add_model_turn(assistant("b"), [1, 2, 3, 7], [8, 9], [-0.1, -0.2], temperature=1.0,
                                routed_experts=[[[e, e + 1]] for e in range(5)])
    assert node.token_ids == [7, 8, 9]
    assert node.routed_experts == [[[3, 4]], [[4, 5]], []]


def test_a_shared_prompt_row_lays_out_routing_where_its_tokens_are() -> None:
    def sample(own: list[int]) -> Sample:
        ids = [1, 2, *own]
        routing = [[[t % EXPERTS, (t + 1) % EXPERTS]] for t in ids]
        return Sample(token_ids=ids, loss_mask=[False, False] + [True] * len(own), logprobs=[0.0] * len(ids),
                      routed_experts=routing)

    batch = collate(rows([sample([3, 4]), sample([5, 6, 7])], token_budget=64, share=True))
    assert batch.routed_experts is not None
    laid = batch.routed_experts[..., 0, 0]
    real = batch.attention_mask.any(-2)[:, 0] if batch.attention_mask.dim() == 4 else batch.attention_mask.bool()
    torch.testing.assert_close(laid[real], batch.input_ids[real] % EXPERTS)
    assert bool((laid[~real] == -1).all())
