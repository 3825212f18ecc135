"""Benchmark: merged weight sync, save + vLLM load seconds, four ways side by side in one run.

SmolLM2-135M with LoRA r=16 on every linear layer (the trainer's default targets), vLLM (CPU build, dev mode,
one process, the merge extension loaded). Each rep moves the adapter (as a step would) and publishes it each way,
alternating: `full-disk` (every weight merged into `model.safetensors` in a folder on disk, vLLM reloads it),
`changed-disk` (all but the frozen embeddings; vLLM reloads those and keeps the embeddings it holds),
`changed-tmpfs` (the same into a folder on /dev/shm) and `adapter-merge` (the trainer writes only its adapter and
vLLM merges it into the base weights it keeps, `models.merge_extension`: what `tracegym rl` does now). After the
last rep each way publishes the same weights: their greedy outputs must agree, and differ from the base model's.

`--full`: a full fine-tune instead (every weight trains, so every weight is sent: `full-disk` and `full-tmpfs`).
`--step-tokens N`: also time the trainer's step on a reverse-text batch of N-token completions
(`trainer_step.batch`), one warm-up and `--reps` timed, and print each way's sync as a share of it (issue 38: a
sync should cost at most 5% of the step).

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/weight_sync.py [--reps 5] [--full] [--step-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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
    """Nudge every trained weight (LoRA: every B) as a step would, at a size that changes greedy text."""
    generator = torch.Generator().manual_seed(seed)
    scale = 0.02 if trainer.is_lora else 0.002
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if param.requires_grad and ("lora_B" in name or not trainer.is_lora):
                param.add_(torch.randn(param.shape, generator=generator) * scale)


def step_seconds(trainer: Trainer, tokens: int, reps: int) -> float:
    """Mean seconds of the trainer's step on a reverse-text batch of `tokens`-token completions (after a warm-up);
    the weights are put back afterwards, so the syncs publish what they would have."""
    sys.path.insert(0, str(Path(__file__).parent))
    from trainer_step import batch

    saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    samples = batch(tokens=tokens)
    trainer.step(samples)
    start = time.perf_counter()
    for _ in range(reps):
        trainer.step(samples)
    took = (time.perf_counter() - start) / reps
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if name in saved:
                param.copy_(saved[name])
    return took


def publish(trainer: Trainer, sync: MergedWeightSync, folder: Path, way: str) -> tuple[float, float]:
    """Save the way `way` says and publish; the seconds of each."""
    start = time.perf_counter()
    if way == "adapter-merge":
        path = trainer.save_weights(folder)
    else:
        path = trainer.save_merged(folder, changed_only=way.startswith("changed"))
    saved = time.perf_counter()
    sync.publish(path, trainer.version)
    return saved - start, sync.last_seconds


def greedy(base_url: str) -> str:
    body = {"model": SERVED_MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0.0}
    return json.loads(transport.call(base_url + "/completions", body, timeout=60))["choices"][0]["text"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="publishes per way")
    parser.add_argument("--full", action="store_true", help="a full fine-tune: every weight is sent")
    parser.add_argument("--step-tokens", type=int, help="also time a trainer step of this completion length")
    args = parser.parse_args()
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, lora=not args.full, lora_rank=16, lora_alpha=32,
                                          num_threads=2))
    step = step_seconds(trainer, args.step_tokens, args.reps) if args.step_tokens else None
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=512,
                              cpu_kv_cache_gib=0.25, cpu_one_process=True, merge_adapters=True)
    ways = ["full-disk", "full-tmpfs"] if args.full else ["full-disk", "changed-disk", "changed-tmpfs", "adapter-merge"]
    times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    with (tempfile.TemporaryDirectory(prefix="tracegym-sync-disk-", dir=Path.home()) as disk,
          tempfile.TemporaryDirectory(prefix="tracegym-sync-", dir=TMPFS) as shm, VLLMServer(config) as server):
        sync = MergedWeightSync(server.base_url, SERVED_MODEL_NAME, base_model=model_dir)
        folders = {"full-disk": Path(disk) / "full", "full-tmpfs": Path(shm) / "full",
                   "changed-disk": Path(disk) / "changed",
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
        share = f"{(save + load) / step:>8.1%}" if step else ""
        print(f"{way:<16}{sizes[way]:>8.0f}{save:>8.3f}{load:>8.3f}{save + load:>8.3f}{share}")
    if step:
        print(f"trainer step ({'full weights' if args.full else 'LoRA r=16'}, 16 x {args.step_tokens} completion "
              f"tokens): {step:.3f} s; the last column is each way's sync over it")
    old, *new = (sum(statistics.fmean(r[i] for r in times[w]) for i in (0, 1)) for w in ways)
    print("ratio to full-disk: " + ", ".join(f"{w} {n / old:.2f}" for w, n in zip(list(ways)[1:], new, strict=True)))
    same = len(set(texts.values())) == 1
    print(f"greedy text: base {base_text!r}; after every way {'the same' if same else 'DIFFERENT'} "
          f"({texts[ways[-1]]!r}); {'changed' if texts[ways[-1]] != base_text else 'UNCHANGED'}")


if __name__ == "__main__":
    main()
