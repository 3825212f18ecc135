"""Tiny MoE sampler: a small in-memory Qwen3-MoE and a teacher-forced "sampler" whose routing ties break otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch

from tracegym.models.expert_routing import recorded_routing, replayed_weights, routers, stacked


def tiny_moe(seed: int = 0, vocab_size: int = 64, layers: int = 2, experts: int = 8, top_k: int = 2) -> Any:
    """A float32 Qwen3-MoE small enough to build inside a test (seconds), seeded."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape: dict[str, Any] = {"head_dim": 8, "num_experts": experts, "num_experts_per_tok": top_k}
    config = Qwen3MoeConfig(vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                            num_hidden_layers=layers, moe_intermediate_size=16, intermediate_size=16,
                            norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=True, **shape)
    torch.manual_seed(seed)
    model: Any = Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():  # a trained model's scales: peaked next-token logits, routers with some near-ties
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        for router in routers(model):
            cast(torch.Tensor, router.weight).normal_(0.0, 1.0)
    return model


@contextmanager
def jittered_selection(model: torch.nn.Module, scale: float, seed: int = 0) -> Iterator[None]:
    """Within the block the routers choose their top-k from logits plus `scale` Gaussian noise, as other kernels'
    rounding would, and weigh the chosen experts by the clean logits: only near-ties change hands."""
    generator = torch.Generator().manual_seed(seed)

    def hook(router: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        logits, weights, indices = output
        noise = torch.randn(logits.shape, generator=generator) * scale
        chosen = torch.topk(logits.float() + noise, indices.shape[-1], dim=-1).indices
        return logits, replayed_weights(router, logits, chosen).to(weights.dtype), chosen

    handles = [r.register_forward_hook(hook) for r in routers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def sampled(model: Any, token_ids: list[int], scale: float) -> tuple[list[float], list[list[list[int]]]]:
    """The jittered sampler's view of `token_ids` (teacher-forced): each token's logprob (0.0 for the first) and
    the experts each token was routed to, `[token][layer][k]` (the last token's included)."""
    record: list[list[torch.Tensor]] = []
    ids = torch.tensor([token_ids])
    with jittered_selection(model, scale), recorded_routing(model, record):
        logits = model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return [0.0, *logprobs.tolist()], stacked(record).tolist()
