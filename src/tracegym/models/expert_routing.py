"""Expert routing: forward hooks on an MoE model's top-k routers that force the experts a sampler chose, or record them.

A transformers MoE block asks its router (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`, ...) for `(logits, weights,
indices)` over the flattened `[B * T]` positions and sends each position to the experts in `indices`, mixed by
`weights`. Replay keeps the router's logits (so its weights still learn) and replaces the top-k choice with the
recorded experts: the weights become the router's softmax over the forced experts, renormalized as the router
renormalizes its own top-k. A position recorded as -1 keeps the router's own choice. Numerics (bf16, other
kernels) that flip a near-tie between the k-th and (k+1)-th expert then no longer change which experts run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tracegym.core.errors import UsageError

SOFTMAX_TOP_K_ROUTERS = ("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter")
"""transformers routers that return `(logits, weights, indices)` with weights the softmax over the top-k
(renormalized as `norm_topk_prob` says): the ones whose choice replay knows how to replace."""


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's softmax top-k routers in layer order (one per MoE layer)."""
    return [m for m in model.modules() if type(m).__name__ in SOFTMAX_TOP_K_ROUTERS]


@contextmanager
def forced_routing(model: torch.nn.Module, routing: torch.Tensor) -> Iterator[None]:
    """Within the block, every forward of `model` over `[B, T]` positions routes position `(b, t)` of MoE layer
    `l` to the experts `routing[b, t, l]` (`[B, T, L, K]`, -1: the router's own choice)."""
    found = routers(model)
    if len(found) != routing.shape[2]:
        raise UsageError(f"the samples' routed_experts name {routing.shape[2]} MoE layers and the model has "
                         f"{len(found)} routers replay can force ({', '.join(SOFTMAX_TOP_K_ROUTERS)}): another "
                         "model sampled them, or its router is of a kind replay does not know")
    handles = [r.register_forward_hook(_forcing(routing[:, :, layer].reshape(-1, routing.shape[3])))
               for layer, r in enumerate(found)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _forcing(forced: torch.Tensor) -> Any:
    """The forward hook that replaces a router's top-k indices with `forced` ([N, K]; rows with a -1 stay free)."""
    def hook(router: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        logits, weights, indices = output
        if forced.shape[0] != indices.shape[0]:
            raise UsageError(f"expert replay: the router saw {indices.shape[0]} positions and the batch recorded "
                             f"{forced.shape[0]}")
        free = (forced < 0).any(dim=-1, keepdim=True)
        chosen = torch.where(free, indices, forced.to(indices.device))
        return logits, replayed_weights(router, logits, chosen).to(weights.dtype), chosen
    return hook


def replayed_weights(router: torch.nn.Module, logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The router's softmax probabilities of the `chosen` experts, renormalized over them when the router
    renormalizes its top-k (`norm_topk_prob`; Mixtral always does)."""
    picked = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
    if getattr(router, "norm_topk_prob", True):
        picked = picked / picked.sum(dim=-1, keepdim=True)
    return picked


@contextmanager
def recorded_routing(model: torch.nn.Module, into: list[list[torch.Tensor]]) -> Iterator[None]:
    """Within the block, each forward appends to `into[l]` the `[N, K]` experts MoE layer `l` chose (`into` is
    filled with one list per router)."""
    found = routers(model)
    into[:] = [[] for _ in found]

    def recorder(layer: int) -> Any:
        def hook(router: torch.nn.Module, args: Any, output: tuple[torch.Tensor, ...]) -> None:
            into[layer].append(output[2].detach().clone())
        return hook

    handles = [r.register_forward_hook(recorder(layer)) for layer, r in enumerate(found)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def stacked(into: list[list[torch.Tensor]]) -> torch.Tensor:
    """`recorded_routing`'s record as one `[N, L, K]` tensor (positions of every forward, in order)."""
    return torch.stack([torch.cat(calls) for calls in into], dim=1)
