"""Benchmark: one trainer step (SmolLM2-135M, LoRA r=16) under each trainer setting, side by side in one run.

The batch is a reverse-text step's shape at equal work with `rl_step_vs_trl.py`: 4 groups of 4 rollouts, each
group one prompt of 34-41 tokens (reverse-text's are 37.5 on average) and every rollout 48 sampled tokens. The
sampler logprobs are the trainer's own, so no token is masked. Each setting runs in a subprocess of its own (its
peak RSS is its own; the allocator is preloaded), settings alternate over `--reps` rounds, and each reports the
mean of `--steps` steps after a warm-up step. `--tokens` sets the completions' length (48: the reverse-text step;
256: issue 38's long case), `--only` picks settings. `--profile` splits the default setting's step into collation,
forward, backward and optimizer, and lists the torch profiler's top operators.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/trainer_step.py [--reps 2] [--profile] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from tracegym.core.sample import Sample
from tracegym.train.malloc import malloc_env

RESULT = "RESULT "
DEFAULTS = "defaults (auto dtype, shared prompts, tcmalloc)"
FLOAT32 = {"compute_dtype": "float32"}
SETTINGS: dict[str, dict[str, Any]] = {
    "before (bf16, ckpt, row per sample, glibc)": {"compute_dtype": "bfloat16", "gradient_checkpointing": True,
                                                   "share_prompts": False, "malloc": "system"},
    "float32, ckpt, row per sample, glibc": {**FLOAT32, "gradient_checkpointing": True, "share_prompts": False,
                                             "malloc": "system"},
    "float32, row per sample, glibc": {**FLOAT32, "share_prompts": False, "malloc": "system"},
    "float32, shared prompts, glibc": {**FLOAT32, "malloc": "system"},
    "float32, shared prompts, tcmalloc (defaults without AMX)": FLOAT32,
    DEFAULTS: {},
    "defaults + gradient checkpointing": {"gradient_checkpointing": True},
    "defaults + 256-token micro-batches": {"micro_batch_tokens": 256},
    "defaults + 1024-token micro-batches": {"micro_batch_tokens": 1024},
    "defaults + 2048-token micro-batches": {"micro_batch_tokens": 2048},
    "defaults, a row per sample": {"share_prompts": False},
    "defaults, a row per sample, 1024-token micro-batches": {"share_prompts": False, "micro_batch_tokens": 1024},
    "defaults + compile": {"compile": True},
    "defaults, LoRA on attention only (less work)": {"lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
}


def batch(seed: int = 0, groups: int = 4, rollouts: int = 4, tokens: int = 48) -> list[Sample]:
    """A reverse-text-shaped step: `groups` prompts of 34-41 tokens, `rollouts` completions of `tokens` each."""
    rng = random.Random(seed)
    out = []
    for group in range(groups):
        prompt = [rng.randrange(100, 40000) for _ in range(34 + 2 * group + rng.randint(0, 1))]
        for i in range(rollouts):
            completion = [rng.randrange(100, 40000) for _ in range(tokens)]
            mask = [False] * len(prompt) + [True] * tokens
            out.append(Sample(token_ids=prompt + completion, loss_mask=mask, logprobs=[0.0] * len(mask),
                              advantage=(i - (rollouts - 1) / 2) / rollouts, temperature=1.0))
    return out


def measure(options: dict[str, Any], steps: int, profile: bool, tokens: int = 48) -> dict[str, Any]:
    """This process's measured steps under `options` (a TrainerConfig override)."""
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.train.trainer import TrainerConfig, build_trainer

    trainer = build_trainer(TrainerConfig(model=str(embedded_model_dir()), num_threads=2, **options))
    samples = batch(tokens=tokens)
    samples = [s.model_copy(update={"logprobs": lp}) for s, lp in zip(samples, trainer.logprobs(samples), strict=True)]
    trainer.step(samples)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        metrics = trainer.step(samples)
        seconds.append(time.perf_counter() - start)
    result = {"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "tokens": sum(sum(s.loss_mask) for s in samples), "micro_batches": metrics["micro_batches"]}
    if profile:
        result["parts"] = parts(trainer, samples)
        print_operators(trainer, samples)
    return result


def parts(trainer: Any, samples: list[Sample]) -> dict[str, float]:
    """One step taken apart (the Trainer's own pieces, timed one after another)."""
    clock = {"collate": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    start = time.perf_counter()
    batches = trainer._micro_batches(samples)
    clock["collate"] = time.perf_counter() - start
    tokens = sum(b.num_loss_tokens for b in batches)
    trainer.optimizer.zero_grad(set_to_none=True)
    for micro in batches:
        start = time.perf_counter()
        loss, _ = trainer._loss(micro, tokens)
        middle = time.perf_counter()
        loss.backward()
        clock["forward"] += middle - start
        clock["backward"] += time.perf_counter() - middle
    start = time.perf_counter()
    trainer._clip()
    trainer.optimizer.step()
    clock["optimizer"] = time.perf_counter() - start
    return clock


def print_operators(trainer: Any, samples: list[Sample]) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step(samples)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)


def run_setting(name: str, args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    """One setting in a subprocess of its own, under the allocator it names."""
    options = SETTINGS[name]
    command = [sys.executable, __file__, "--child", json.dumps(options), "--steps", str(args.steps),
               "--tokens", str(args.tokens)]
    done = subprocess.run(command + (["--profile"] if profile else []), capture_output=True, text=True,
                          env=malloc_env(options.get("malloc", "tcmalloc")))
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    if profile:
        print(done.stderr[-6000:])
    return json.loads(lines[-1].removeprefix(RESULT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1, help="rounds over every setting")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per setting and round")
    parser.add_argument("--profile", action="store_true", help="take the defaults' step apart")
    parser.add_argument("--tokens", type=int, default=48, help="tokens in every completion")
    parser.add_argument("--only", action="append", choices=sorted(SETTINGS), metavar="SETTING",
                        help="run this setting (repeatable; default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(RESULT + json.dumps(measure(json.loads(args.child), args.steps, args.profile, args.tokens)), flush=True)
        return
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.only or SETTINGS}
    for rep in range(args.reps):
        for name in results:
            profile = args.profile and rep == 0 and name == DEFAULTS
            results[name].append(run_setting(name, args, profile=profile))
            print(f"round {rep}: {name}: {statistics.fmean(results[name][-1]['seconds']):.2f} s", flush=True)
    before = statistics.fmean(s for r in results[next(iter(results))] for s in r["seconds"])
    print(f"\n{'setting':<46}{'s/step':>8}{'min':>7}{'x before':>10}{'s/1k tok':>10}{'peak RSS MB':>13}{'mbs':>5}")
    for name, runs in results.items():
        seconds = [s for r in runs for s in r["seconds"]]
        mean = statistics.fmean(seconds)
        print(f"{name:<46}{mean:>8.2f}{min(seconds):>7.2f}{mean / before:>10.2f}"
              f"{1000 * mean / runs[0]['tokens']:>10.2f}{max(r['peak_mb'] for r in runs):>13.0f}"
              f"{runs[0]['micro_batches']:>5.0f}")
        if "parts" in runs[0]:
            shares = runs[0]["parts"]
            total = sum(shares.values())
            print("    " + ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in shares.items()))


if __name__ == "__main__":
    main()
