"""One trainer process of the data-parallel tests: run alone or as a rank under torchrun, it trains a tiny Llama
with the trainer settings of the shipped reverse-text config through the real TrainerLoop, on the batches the
test wrote into a run folder, and records every publish (with the rank that made it) and whether it took the
logprobs straight from the hidden states (`head-rankN.json`).

    python dp_worker.py RUN_DIR STEPS lora|full                                                  # alone
    python -m torch.distributed.run --nproc-per-node 2 dp_worker.py RUN_DIR STEPS lora|full
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tracegym.train.data_parallel import exit_process, join, shard_like
from tracegym.train.rl_folder import RLFolder
from tracegym.train.trainer import TrainerConfig, make_trainer
from tracegym.train.trainer_loop import TrainerLoop

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "rl" / "reverse_text.toml"
VOCAB = 64


def tiny_model() -> LlamaForCausalLM:
    """The same tiny Llama in every process (seeded), its embeddings tied as SmolLM2's are."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        tie_word_embeddings=True))


def trainer_config(lora: bool) -> TrainerConfig:
    """The shipped config's [trainer] section on the tiny model (full weights: the same, without the adapter),
    with the test's overrides ($DP_OVERRIDE, JSON)."""
    section = tomllib.loads(SHIPPED.read_text())["trainer"]
    override = json.loads(os.environ.get("DP_OVERRIDE", "{}"))  # e.g. float32 compute, for an exact comparison
    return TrainerConfig(**{**section, "model": "tiny", "lora": lora, "num_threads": 1, "device": "cpu", **override})


def main(run_dir: Path, steps: int, kind: str) -> None:
    dp = join("cpu")
    config = trainer_config(lora=kind == "lora")
    torch.set_num_threads(1)
    model = tiny_model()
    trainer = make_trainer(model, config, dp=dp)
    if config.lora:  # LoRA B starts at zero; move it (the same on every rank) so the first update shows everywhere
        torch.manual_seed(1)
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.copy_(shard_like(torch.randn(param.shape) * 0.02, param))
    heads = run_dir / f"head-rank{dp.rank}.json"  # whether logprobs came straight from the hidden states
    heads.write_text(json.dumps({"head": trainer.head is not None}))
    published = run_dir / "published.jsonl"

    def publish(path: Path, version: int) -> str:
        with published.open("a") as f:
            f.write(json.dumps({"rank": dp.rank, "version": version, "path": str(path)}) + "\n")
        return "policy"

    loop = TrainerLoop(RLFolder(run_dir), trainer, publish, steps=steps, checkpoint_every=1, merged=config.lora)
    loop.run()
    dp.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    exit_process(0)  # as the trainer role ends
