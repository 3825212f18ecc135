"""Precision: the dtype a trainer computes in on this machine (`TrainerConfig.compute_dtype`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

ComputeDtype = Literal["auto", "bfloat16", "float32"]
CPU_FLAGS = Path("/proc/cpuinfo")


def compute_dtype(setting: ComputeDtype, device: torch.device) -> torch.dtype:
    """The dtype of the trainer's matmuls: `setting`'s, and for `auto` bfloat16 where bfloat16 matmuls are the fast
    ones (a GPU, or a CPU with AMX: `amx_cpu`), else float32."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" or (device.type == "cpu" and amx_cpu()) else torch.float32
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def amx_cpu() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in AMX tiles. There a bfloat16 matmul is 2.6-4.6x faster than a
    float32 one (Xeon with `amx_bf16`, 2 threads: 148 against 56 GFLOPS at 512x576x1536, 412 against 90 for a
    49152-row LM head); with AVX512-BF16 alone it is not (a training step in bfloat16 autocast was 1.7x slower
    there). Asks torch (which also checks that the OS lets the process use the tiles), else the kernel's flags."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if supported is not None:
        return bool(supported())
    try:
        return any("amx_bf16" in line.split() for line in CPU_FLAGS.read_text().splitlines()
                   if line.startswith("flags"))
    except OSError:
        return False
