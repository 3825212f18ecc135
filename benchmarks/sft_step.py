"""Benchmark: SFT tokens per second and peak memory, our trainer against TRL 1.16's `SFTTrainer`, same data and model.

Data: reverse-text tasks answered with their reference answers (what the oracle teacher says), rendered for
SmolLM2-135M-Instruct by `train.sft.branch_tokens` (loss on the answer and its close only). TRL gets the very same
token ids and masks as a tokenized dataset (`input_ids` + `completion_mask`, `completion_only_loss`). Both train the
same LoRA adapter (r=16, alpha 32, every linear layer of a Llama block) with AdamW (lr 1e-3, constant, grad norm
clipped at 1), bfloat16 autocast over float32 weights, no gradient checkpointing, `--batch` samples per optimizer
step in one micro-batch, `--threads` torch threads. Each side runs in a subprocess of its own (its peak RSS is its
own), alternated `--rounds` times (ours, TRL, ours, TRL, ...) so a busy machine slows both alike; each does one
warm-up step, then `--steps` timed steps over distinct batches. Tokens/s counts the real (unpadded) tokens of the
timed batches. Target: ours at least as fast, at no more peak memory.

    python benchmarks/sft_step.py [--rounds 3] [--steps 8] [--batch 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from tracegym.core.messages import assistant
from tracegym.envs.registry import load_taskset
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.renderer import load_renderer
from tracegym.train.sft import branch_tokens
from tracegym.train.trainer import LLAMA_LINEAR_MODULES

LR, RANK, ALPHA = 1e-3, 16, 32


def dataset(count: int) -> list[tuple[list[int], list[bool]]]:
    """`count` (token ids, loss mask) pairs: reverse-text tasks with their answers, as the student sees them."""
    renderer = load_renderer(str(embedded_model_dir()))
    rows = itertools.islice(load_taskset("reverse-text", {"seed": 7, "num_tasks": count}), count)
    return [branch_tokens([*row.initial_messages(), assistant(str(row.answer))], renderer)[0] for row in rows]


def ours(args: argparse.Namespace, data: list[tuple[list[int], list[bool]]]) -> float:
    """Seconds of the timed steps of our trainer (cross-entropy objective)."""
    from tracegym.core.sample import Sample
    from tracegym.train.trainer import TrainerConfig, build_trainer

    trainer = build_trainer(TrainerConfig(
        model=str(embedded_model_dir()), objective="cross_entropy", learning_rate=LR, lora_rank=RANK,
        lora_alpha=ALPHA, compute_dtype="bfloat16", gradient_checkpointing=False, num_threads=args.threads,
        micro_batch_tokens=10**6))  # one micro-batch per step, as TRL's batch
    samples = [Sample(token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids)) for ids, mask in data]
    batches = [samples[i * args.batch:(i + 1) * args.batch] for i in range(args.steps + 1)]
    trainer.step(batches[0])  # warm-up
    start = time.perf_counter()
    for batch in batches[1:]:
        trainer.step(batch)
    return time.perf_counter() - start


def trl(args: argparse.Namespace, data: list[tuple[list[int], list[bool]]]) -> float:
    """Seconds of the timed steps of TRL's SFTTrainer on the same tokens (its batches in order, no shuffling)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(args.threads)
    rows = [{"input_ids": ids, "completion_mask": [int(m) for m in mask]} for ids, mask in data]
    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            output_dir=out, per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
            max_steps=args.steps + 1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, bf16=True, use_cpu=True, gradient_checkpointing=False,
            completion_only_loss=True, max_length=None, packing=False, save_strategy="no", report_to=[],
            logging_steps=10**6, dataloader_num_workers=0, seed=0, disable_tqdm=True)
        lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(LLAMA_LINEAR_MODULES),
                          task_type="CAUSAL_LM")
        trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), peft_config=lora,
                             callbacks=[Clock()])
        trainer._get_train_sampler = lambda *_: torch.utils.data.SequentialSampler(trainer.train_dataset)
        trainer.train()
    return ends[-1] - ends[0]  # from the end of the warm-up step to the end of the last


SIDES = {"ours": ours, "trl": trl}


def worker(args: argparse.Namespace) -> None:
    """One side's run in this process: its seconds, tokens and peak RSS as one JSON line."""
    data = dataset(args.batch * (args.steps + 1))
    seconds = SIDES[args.worker](args, data)
    tokens = sum(len(ids) for ids, _ in data[args.batch:])
    print(json.dumps({"seconds": seconds, "tokens": tokens,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_side(side: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--worker", side, "--steps", str(args.steps), "--batch", str(args.batch),
               "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "tokens_per_s": result["tokens"] / result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run (after one warm-up)")
    parser.add_argument("--batch", type=int, default=16, help="samples per optimizer step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    print(f"{'round':>5} {'side':>5} {'tokens/s':>9} {'s/step':>7} {'peak MB':>8}")
    for round_ in range(args.rounds):
        for side in SIDES:
            result = run_side(side, args)
            results[side].append(result)
            print(f"{round_:>5} {side:>5} {result['tokens_per_s']:>9.0f} {result['seconds'] / args.steps:>7.2f} "
                  f"{result['peak_mb']:>8.0f}", flush=True)
    speed = [o["tokens_per_s"] / t["tokens_per_s"] for o, t in zip(results["ours"], results["trl"], strict=True)]
    memory = [o["peak_mb"] / t["peak_mb"] for o, t in zip(results["ours"], results["trl"], strict=True)]
    tokens = {side: statistics.median(r["tokens_per_s"] for r in rows) for side, rows in results.items()}
    peaks = {side: max(r["peak_mb"] for r in rows) for side, rows in results.items()}
    print(f"median tokens/s: ours {tokens['ours']:.0f}, TRL SFTTrainer {tokens['trl']:.0f}; ours/TRL per round "
          f"{', '.join(f'{s:.2f}' for s in speed)} (median {statistics.median(speed):.2f}x, target >= 1)")
    print(f"peak RSS: ours {peaks['ours']:.0f} MB, TRL {peaks['trl']:.0f} MB; ours/TRL per round "
          f"{', '.join(f'{m:.2f}' for m in memory)} (target <= 1)")


if __name__ == "__main__":
    main()
