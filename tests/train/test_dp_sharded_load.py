"""Ranks that share the model (2 gloo processes under torchrun): each builds it on the meta device and reads only
its shards of the folder's weights, and a checkpoint saved at one world size loads at the other, LoRA and full."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from tracegym.models.embedded import embedded_model_dir
from tracegym.train.trainer import _checkpoint_name

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("dp_load_worker.py")


def model_folder(path: Path) -> Path:
    """A tiny Llama (tied embeddings) saved as a model folder, with the embedded model's tokenizer."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 tie_word_embeddings=True)).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((embedded_model_dir() / name).read_bytes())
    return path


def launch(processes: int, model: Path, out: Path, *actions: str) -> None:
    command = [sys.executable, str(WORKER), str(model), str(out), *actions]
    if processes > 1:
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Full weights saved by one process and loaded by 2 ranks; LoRA saved by 2 ranks and loaded by one."""
    root = tmp_path_factory.mktemp("sharded")
    model, out = model_folder(root / "model"), root / "out"
    out.mkdir()
    launch(1, model, out, f"full:save:{root / 'full'}")
    launch(2, model, out, f"full:load:{root / 'full'}", f"lora:save:{root / 'lora'}")
    launch(1, model, out, f"lora:load:{root / 'lora'}")
    return model, out


def gathered(out: Path, tag: str) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"{tag}.safetensors"))


def test_each_rank_holds_half_of_the_model_read_from_the_folder(runs):
    model, out = runs
    folder = load_file(str(model / "model.safetensors"))
    whole = gathered(out, "lora-save-2")
    base = {_checkpoint_name(n): v for n, v in whole.items() if "lora_" not in n}
    assert base.keys() == folder.keys()
    assert all(torch.equal(base[k], folder[k]) for k in folder)  # the step trained the adapter only
    counts = [json.loads((out / f"lora-save-2-rank{r}.json").read_text())["local"] for r in (0, 1)]
    assert sum(counts) == sum(v.numel() for v in whole.values())
    assert max(counts) < 0.55 * sum(counts)


def test_a_full_checkpoint_saved_by_one_process_loads_on_two_ranks(runs):
    _, out = runs
    saved, loaded = gathered(out, "full-save-1"), gathered(out, "full-load-2")
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert json.loads((out / "full-load-2-rank1.json").read_text())["version"] == 1


def test_a_lora_checkpoint_saved_by_two_ranks_loads_in_one_process(runs):
    _, out = runs
    saved, loaded = gathered(out, "lora-save-2"), gathered(out, "lora-load-1")
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert any(float(v.abs().max()) > 0 for k, v in loaded.items() if "lora_B" in k)  # the step moved the adapter
