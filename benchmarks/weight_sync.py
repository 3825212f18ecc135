"""Benchmark: merged weight sync, save + vLLM load seconds, four ways side by side in one run.

SmolLM2-135M with LoRA r=16 on every linear layer (the trainer's default targets), vLLM (CPU build, dev mode,
one process, the merge extension loaded). Each rep moves the adapter (as a step would) and publishes it each way,
alternating: `full-disk` (every weight merged into `model.safetensors` in a folder on disk, vLLM reloads it),
`changed-disk` (all but the frozen embeddings; vLLM reloads those and keeps the embeddings it holds),
`changed-tmpfs` (the same into a folder on /dev/shm) and `adapter-merge` (the trainer writes only its adapter and
vLLM merges it into the base weights it keeps, `models.merge_extension`: what `tracegym rl` does now). After the
last rep each way publishes the same weights: their greedy outputs must agree, and differ from the base model's.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/weight_sync.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tracegym.models import transport
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.trainer import Trainer, TrainerConfig, build_trainer
from tracegym.train.weight_sync import MergedWeightSync

TMPFS = Path("/dev/shm")
PROMPT = "The capital of France is"


def move_adapter(trainer: Trainer, seed: int) -> None:
    """Nudge every LoRA B (what a trainer step does, at a size that changes greedy text)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)


def publish(trainer: Trainer, sync: MergedWeightSync, folder: Path, way: str) -> tuple[float, float]:
    """Save the way `way` says and publish; the seconds of each."""
    start = time.perf_counter()
    if way == "adapter-merge":
        path = trainer.save_weights(folder)
    else:
        path = trainer.save_merged(folder, changed_only=way != "full-disk")
    saved = time.perf_counter()
    sync.publish(path, trainer.version)
    return saved - start, sync.last_seconds


def greedy(base_url: str) -> str:
    body = {"model": SERVED_MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0.0}
    return json.loads(transport.call(base_url + "/completions", body, timeout=60))["choices"][0]["text"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="publishes per way")
    args = parser.parse_args()
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, lora_rank=16, lora_alpha=32, num_threads=2))
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=512,
                              cpu_kv_cache_gib=0.25, cpu_one_process=True, merge_adapters=True)
    ways = ["full-disk", "changed-disk", "changed-tmpfs", "adapter-merge"]
    times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    with (tempfile.TemporaryDirectory(prefix="tracegym-sync-disk-", dir=Path.home()) as disk,
          tempfile.TemporaryDirectory(prefix="tracegym-sync-", dir=TMPFS) as shm, VLLMServer(config) as server):
        sync = MergedWeightSync(server.base_url, SERVED_MODEL_NAME, base_model=model_dir)
        folders = {"full-disk": Path(disk) / "full", "changed-disk": Path(disk) / "changed",
                   "changed-tmpfs": Path(shm) / "changed", "adapter-merge": Path(disk) / "adapter"}
        base_text = greedy(server.base_url)
        for rep in range(args.reps):
            move_adapter(trainer, rep)
            for way in ways:
                trainer.version += 1
                times[way].append(publish(trainer, sync, folders[way], way))
                print(f"rep {rep} {way}: save {times[way][-1][0]:.3f} s  load {times[way][-1][1]:.3f} s", flush=True)
        texts = {}
        for way in ways:
            publish(trainer, sync, folders[way], way)
            texts[way] = greedy(server.base_url)
        sizes = {way: sum(f.stat().st_size for f in folders[way].glob("*.safetensors")) / 2**20 for way in ways}
    print(f"\nmerged weight sync, {args.reps} reps each (mean seconds; load average {os.getloadavg()[0]:.1f})")
    print(f"{'way':<16}{'MB':>8}{'save':>8}{'load':>8}{'total':>8}")
    for way, rows in times.items():
        save, load = statistics.fmean(r[0] for r in rows), statistics.fmean(r[1] for r in rows)
        print(f"{way:<16}{sizes[way]:>8.0f}{save:>8.3f}{load:>8.3f}{save + load:>8.3f}")
    old, *new = (sum(statistics.fmean(r[i] for r in times[w]) for i in (0, 1)) for w in ways)
    print("ratio to full-disk: " + ", ".join(f"{w} {n / old:.2f}" for w, n in zip(list(ways)[1:], new, strict=True)))
    same = len(set(texts.values())) == 1
    print(f"greedy text: base {base_text!r}; after every way {'the same' if same else 'DIFFERENT'} "
          f"({texts['adapter-merge']!r}); {'changed' if texts['adapter-merge'] != base_text else 'UNCHANGED'}")


if __name__ == "__main__":
    main()
