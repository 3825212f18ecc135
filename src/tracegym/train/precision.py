"""Precision: the dtype a trainer computes in on this machine (`TrainerConfig.compute_dtype`)."""

from __future__ import annotations

from typing import Literal

import torch

ComputeDtype = Literal["auto", "bfloat16", "float32"]


def compute_dtype(setting: ComputeDtype, device: torch.device) -> torch.dtype:
    """The dtype of the trainer's matmuls: `setting`'s, and for `auto` bfloat16 on a GPU, float32 on a CPU. On a CPU
    with AMX (`amx_bf16`), `bfloat16` is the fast one (a LoRA step 0.59x float32's time, `benchmarks/
    rl_step_vs_trl.md`) but stays opt-in until the slow suite has run with it: a slow test's kill schedule assumed
    float32's step time (`test_rl_kill_each_process_vllm`, the run ended first)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if setting == "bfloat16" else torch.float32
