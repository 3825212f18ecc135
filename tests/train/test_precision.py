"""The trainer's compute dtype: `auto` takes bfloat16 on a GPU, float32 on a CPU; a named dtype anywhere."""

import torch

from tracegym.train.precision import compute_dtype

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def test_auto_is_bfloat16_on_a_gpu_and_float32_on_a_cpu():
    assert compute_dtype("auto", GPU) == torch.bfloat16 and compute_dtype("auto", CPU) == torch.float32


def test_a_named_dtype_is_taken_on_any_device():
    assert compute_dtype("float32", CPU) == compute_dtype("float32", GPU) == torch.float32
    assert compute_dtype("bfloat16", CPU) == torch.bfloat16
