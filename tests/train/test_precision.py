"""The trainer's compute dtype: `auto` takes bfloat16 where its matmuls are the fast ones."""

import pytest
import torch

from tracegym.train import precision
from tracegym.train.precision import amx_cpu, compute_dtype

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def test_auto_is_bfloat16_on_a_gpu():
    assert compute_dtype("auto", GPU) == torch.bfloat16


@pytest.mark.parametrize(("amx", "dtype"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_a_cpu_is_bfloat16_only_with_amx(monkeypatch, amx, dtype):
    monkeypatch.setattr(precision, "amx_cpu", lambda: amx)
    assert compute_dtype("auto", CPU) == dtype


def test_a_named_dtype_is_taken_on_any_device(monkeypatch):
    monkeypatch.setattr(precision, "amx_cpu", lambda: True)
    assert compute_dtype("float32", CPU) == compute_dtype("float32", GPU) == torch.float32
    assert compute_dtype("bfloat16", CPU) == torch.bfloat16


@pytest.mark.parametrize(("flags", "amx"), [("fpu avx512_bf16 amx_bf16 amx_tile", True), ("fpu avx512_bf16", False)])
def test_without_torchs_answer_amx_is_read_from_the_cpu_flags(monkeypatch, tmp_path, flags, amx):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(precision, "CPU_FLAGS", tmp_path / "cpuinfo")
    assert amx_cpu() is amx
