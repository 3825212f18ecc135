"""A CPU stand-in for the flash-attention kernel TRL 1.16's `AsyncGRPOTrainer` fetches from the Hugging Face Hub.

The trainer loads its model with `attn_implementation="tree_fa3"` (`trl.experimental.async_grpo.packing`), whose
only dependency on CUDA is `_flash_attn().flash_attn_varlen_func`, a CUDA kernel downloaded from the Hub at first
use (no GPU here, and no Hub on any machine these tests run on). `flash_attn_varlen_func` below computes the same
function with `torch.nn.functional.scaled_dot_product_attention`, one packed segment at a time: queries of segment
`i` are rows `cu_seqlens_q[i]:cu_seqlens_q[i+1]`, its keys and values rows `cu_seqlens_k[i]:cu_seqlens_k[i+1]`, and
`causal` is flash-attention's bottom-right alignment (query `j` of `Lq` sees keys up to `Lk - Lq + j`), with
grouped-query heads. Everything else the trainer does (rollout worker process, packing, loss, optimizer, LoRA sync to
vLLM) is TRL's own code.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), **_: object) -> torch.Tensor:
    """`(total_q, heads, dim)` attention outputs of the packed segments, as flash-attention's varlen kernel."""
    if window_size != (-1, -1):
        raise NotImplementedError("a sliding window: SmolLM2 has none")
    outputs = []
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = (int(x) for x in (cu_seqlens_q[i], cu_seqlens_q[i + 1], cu_seqlens_k[i], cu_seqlens_k[i + 1]))
        query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke], v[ks:ke]))
        mask = None
        if causal:
            lq, lk = qe - qs, ke - ks
            mask = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=softmax_scale,
                                             enable_gqa=query.shape[1] != key.shape[1])
        outputs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outputs)


KERNEL = SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)
"""What `packing._flash_attn()` returns in its place."""
