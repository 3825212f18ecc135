"""Benchmark: an RL step at equal work, TRL 1.16 `GRPOTrainer` against ours, alternated in one run.

Equal work on both sides: SmolLM2-135M, the same reverse-text prompts (4 tasks, seed 1000 + step, as
`rl_step.py`), 4 completions each (16 a step) of exactly `--tokens` tokens (TRL: transformers' `min_new_tokens`
= `max_new_tokens`; ours: vLLM's `min_tokens` + `ignore_eos`), LoRA r=16 / alpha 32 on every linear layer,
AdamW at the same learning rate, the same torch thread count. TRL at its best CPU setting (issue 7): float32
(`bf16` off, `use_cpu`), micro-batch 4 x 4 accumulation, gradient checkpointing, generation by the policy
itself (no weight sync). Ours: `rl_step.py`'s step (vLLM generation, one trainer step, weight sync; steps one
after the other). Each side runs in a subprocess of its own (so each peak RSS is that side's) and the pair is
run `--reps` times, TRL first, alternating. Every side's processes run with the same allocator (`--malloc`:
tcmalloc where installed, what `tracegym rl` gives its trainer and vLLM). Printed: seconds per step and per
1,000 completion tokens, split into generation / training / weight sync, each process's peak memory, the cores
our trainer and our idle vLLM kept busy during our train phase (below ~1.9 of 2 trainer threads: something else
on the machine took the rest), and ours / TRL per completion token. `--micro-batch-tokens A B` runs one of our
sides per trainer micro-batch budget, side by side with the same TRL side.

`--loop`: also the real `tracegym rl` loop (generation of step n+1 overlapping step n's training,
`max_async_steps = 1`) at the same work, with its own thread split (the trainer half the cores), its seconds
per step read from its trainer_metrics.jsonl.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/rl_step_vs_trl.py [--reps 2] [--steps 3] [--loop]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import rl_step  # the benchmark beside this one: its step is "ours"

from tracegym.train.malloc import malloc_env

RESULT = "RESULT "
PARTS = ("generation", "training", "weight_sync", "total")
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def trl_side(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's measured steps: each step's parts (generation: its `_generate`; training: the rest of the step)."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tracegym.envs.registry import load_taskset
    from tracegym.interop.trl import train_dataset
    from tracegym.models.embedded import embedded_model_dir

    torch.set_num_threads(args.threads)
    model_dir = str(embedded_model_dir())
    total = args.warmup + args.steps
    datasets = [train_dataset(load_taskset("reverse-text", {"seed": 1000 + s}), num_tasks=args.tasks)
                for s in range(total)]
    from datasets import concatenate_datasets

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        """How much of the reversed prompt a completion holds (varies, so each group has a signal)."""
        return [difflib.SequenceMatcher(None, c[-1]["content"], p[-1]["content"][::-1]).ratio()
                for p, c in zip(prompts, completions, strict=True)]

    config = GRPOConfig(output_dir=args.out, per_device_train_batch_size=4, gradient_accumulation_steps=4,
                        num_generations=args.rollouts, max_completion_length=args.tokens,
                        generation_kwargs={"min_new_tokens": args.tokens}, gradient_checkpointing=True,
                        max_steps=total, learning_rate=args.lr, shuffle_dataset=False, use_cpu=True, bf16=False,
                        save_strategy="no", report_to="none", logging_steps=1, temperature=1.0)
    lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=LORA_MODULES, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model_dir, processing_class=AutoTokenizer.from_pretrained(model_dir), args=config,
                          train_dataset=concatenate_datasets(datasets), reward_funcs=[reward], peft_config=lora)
    steps: list[dict[str, float]] = []
    clock = {"generation": 0.0, "tokens": 0.0}
    generate = trainer._generate

    def timed_generate(prompts: list[Any]) -> Any:
        start = time.perf_counter()
        out = generate(prompts)
        clock["generation"] += time.perf_counter() - start
        clock["tokens"] += float(sum(len(ids) for ids in out[1]))  # (prompt_ids, completion_ids, ...)
        return out

    trainer._generate = timed_generate

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            clock.update(generation=0.0, tokens=0.0, start=time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            took = time.perf_counter() - clock["start"]
            steps.append({"generation": clock["generation"], "training": took - clock["generation"],
                          "weight_sync": 0.0, "total": took, "completion_tokens": clock["tokens"]})

    trainer.add_callback(StepClock())
    trainer.train()
    return {"steps": steps[args.warmup:], "peak_mb": peak_rss_mb()}


def our_side(args: argparse.Namespace) -> dict[str, Any]:
    """`rl_step.py`'s measured steps at the same work."""
    flags = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--tasks", str(args.tasks),
             "--rollouts", str(args.rollouts), "--max-tokens", str(args.tokens), "--rank", str(args.rank),
             "--lr", str(args.lr), "--threads", str(args.threads), "--sync", args.sync, "--fixed-length"]
    flags += ["--vllm-compile"] if args.vllm_compile else []
    flags += ["--trainer-compile"] if args.trainer_compile else []
    flags += ["--micro-batch-tokens", str(args.budget)] if args.budget else []
    rows, memory = asyncio.run(rl_step.run(rl_step.arguments().parse_args(flags)))
    return {"steps": rows, "peak_mb": peak_rss_mb(), "vllm_peak_mb": memory.vllm}


def loop_side(args: argparse.Namespace) -> dict[str, Any]:
    """The real `tracegym rl` loop at the same work; its steps' parts from trainer_metrics.jsonl, seconds per step
    from the time between consecutive steps' records (so overlap shows)."""
    config = Path(__file__).parents[1] / "configs" / "rl" / "reverse_text.toml"
    total = args.warmup + args.steps
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(config), "--steps", str(total),
               "--orchestrator.tasks-per-step", str(args.tasks), "--orchestrator.group-size", str(args.rollouts),
               "--orchestrator.max-async-steps", "1", "--orchestrator.eval.every", "0",
               "--orchestrator.eval.num-tasks", "1", "--orchestrator.train.sampling.max-tokens",
               str(args.tokens), "--orchestrator.train.sampling.extra",
               json.dumps(rl_step.fixed_length(args.tokens)), "--trainer.lora-rank", str(args.rank),
               "--trainer.lora-alpha", str(2 * args.rank), "--trainer.learning-rate", str(args.lr),
               "--checkpoint-every", str(total + 1),
               "--output-dir", args.out, "--run-id", "loop"]
    command += ["--model.vllm-args", json.dumps(["--no-enforce-eager"])] if args.vllm_compile else []
    command += ["--trainer.compile", "true"] if args.trainer_compile else []
    command += ["--trainer.num-threads", str(args.loop_threads)] if args.loop_threads else []
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tracegym rl failed ({done.returncode}):\n{done.stderr[-3000:]}")
    run = Path(args.out) / "loop"
    records = [json.loads(line) for line in (run / "trainer_metrics.jsonl").read_text().splitlines()]
    steps = [{"generation": record.get("generation_s") or 0.0, "training": record["train_s"],
              "weight_sync": record["weight_sync_s"], "total": record["time"] - before["time"],
              "completion_tokens": float(args.tasks * args.rollouts * args.tokens)}
             for before, record in itertools.pairwise(records)][max(args.warmup - 1, 0):]
    return {"steps": steps, "peak_mb": float("nan")}


SIDES = {"trl": trl_side, "ours": our_side, "loop": loop_side}


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a subprocess of its own; its result."""
    passed = {k.replace("_", "-"): v for k, v in vars(args).items()
              if k not in ("side", "reps", "loop", "out", "malloc", "micro_batch_tokens")
              and v not in (None, False)}
    flags = [f"--{k}" if v is True else f"--{k}={v}" for k, v in passed.items()]
    with tempfile.TemporaryDirectory(prefix=f"tracegym-vs-trl-{side}-") as out:
        done = subprocess.run([sys.executable, __file__, "--side", side, "--out", out, *flags],
                              capture_output=True, text=True, env=malloc_env(args.malloc))
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{side} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix(RESULT))


def summary(result: dict[str, Any]) -> dict[str, float]:
    """Mean seconds of each part per step, per 1,000 completion tokens, and peak memory."""
    steps = result["steps"]
    out = {part: statistics.fmean(s[part] for s in steps) for part in PARTS}
    out["tokens"] = statistics.fmean(s["completion_tokens"] for s in steps)
    out["per_1k"] = 1000 * out["total"] / out["tokens"]
    for busy in ("trainer_cores", "vllm_cores_in_training"):  # cores each process kept busy while ours trained
        if all(busy in s for s in steps):
            out[busy] = statistics.fmean(s[busy] for s in steps)
    return out | {k: v for k, v in result.items() if k.endswith("_mb")}


def print_rows(rows: list[tuple[int, str, dict[str, float]]]) -> None:
    print(f"\n{'rep':<4}{'side':<10}{'s/step':>8}{'gen':>7}{'train':>7}{'sync':>7}{'tokens':>8}{'s/1k tok':>10}"
          f"{'peak RSS MB':>13}{'vLLM RSS MB':>13}{'train cores: ours / vLLM':>26}")
    for rep, side, s in rows:
        print(f"{rep:<4}{side:<10}{s['total']:>8.2f}{s['generation']:>7.2f}{s['training']:>7.2f}"
              f"{s['weight_sync']:>7.2f}{s['tokens']:>8.0f}{s['per_1k']:>10.2f}{s['peak_mb']:>13.0f}"
              f"{s.get('vllm_peak_mb', float('nan')):>13.0f}"
              f"{s.get('trainer_cores', float('nan')):>20.2f} / {s.get('vllm_cores_in_training', float('nan')):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="TRL / ours pairs, alternated")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side and rep")
    parser.add_argument("--warmup", type=int, default=1, help="steps each side runs first, not measured")
    parser.add_argument("--tasks", type=int, default=4, help="prompts per step")
    parser.add_argument("--rollouts", type=int, default=4, help="completions per prompt")
    parser.add_argument("--tokens", type=int, default=48, help="tokens in every completion")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha twice it)")
    parser.add_argument("--lr", type=float, default=2e-4, help="learning rate")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each trainer")
    parser.add_argument("--sync", choices=["merged", "lora"], default="merged", help="our weight sync")
    parser.add_argument("--loop", action="store_true", help="also the real `tracegym rl` loop, after the pairs")
    parser.add_argument("--malloc", choices=["tcmalloc", "system"], default="tcmalloc",
                        help="the allocator of every side's process (the same on both; `tracegym rl`'s trainer "
                             "default is tcmalloc where installed)")
    parser.add_argument("--vllm-compile", action="store_true",
                        help="our vLLM compiles its model instead of running eagerly (both our sides; ~50 s more to "
                             "start each)")
    parser.add_argument("--trainer-compile", action="store_true",
                        help="our trainer compiles its decoder layers (both our sides; TrainerConfig.compile)")
    parser.add_argument("--loop-threads", type=int,
                        help="the loop's trainer torch threads (default: `tracegym rl`'s, half the cores)")
    parser.add_argument("--micro-batch-tokens", type=int, nargs="+", default=[0], metavar="N",
                        help="our trainer's micro-batch token budget; several: one of our sides for each, side by "
                             "side (0: TrainerConfig's default)")
    parser.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(RESULT + json.dumps(SIDES[args.side](args)), flush=True)
        return
    rows = []
    for rep in range(args.reps):
        rows.append((rep, "trl", summary(run_side("trl", args))))
        print(f"rep {rep} trl: {rows[-1][2]['total']:.2f} s/step", flush=True)
        for budget in args.micro_batch_tokens:
            name = f"ours@{budget}" if budget else "ours"
            rows.append((rep, name, summary(run_side("ours", argparse.Namespace(**vars(args) | {"budget": budget})))))
            print(f"rep {rep} {name}: {rows[-1][2]['total']:.2f} s/step", flush=True)
    if args.loop:
        rows.append((0, "loop", summary(run_side("loop", args))))
    print_rows(rows)
    trl = [s["per_1k"] for _, side, s in rows if side == "trl"]
    for name in dict.fromkeys(side for _, side, _ in rows if side.startswith("ours")):
        ours = [s["per_1k"] for _, side, s in rows if side == name]
        if trl and ours:
            print(f"{name} / TRL seconds per completion token: {statistics.fmean(ours) / statistics.fmean(trl):.2f} "
                  "(target <= 0.33)")
    print(f"load average {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} (1 / 5 min)")


if __name__ == "__main__":
    main()
