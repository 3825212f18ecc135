"""Benchmark: the RL trainer step on a GPU (bf16), ours next to TRL's GRPOTrainer in one run, and the weight-sync
preparation (gather + serialise) of each step.

The model is SmolLM2-135M's architecture built from its config with random weights (`--model-dir`: a folder with
its config.json and tokenizer; throughput, MFU and memory do not depend on the weight values). The batch is
`rl_step_vs_trl.py`'s shape: 4 prompts of 34-41 tokens (`trainer_step.batch`) x 4 completions of exactly
`--tokens` tokens, 16 completions a step. Each side runs in a subprocess of its own, one after the other, so each
peak GPU memory (`torch.cuda.max_memory_allocated`) is its own:
- ours: `Trainer.step` (fp32 weights and AdamW, bf16 autocast: `compute_dtype = "auto"` on a GPU), LoRA r=16 on
  every linear layer and full fine-tuning, at the trainer's micro-batch token budget and at `--gpu-micro-tokens`;
  then the weight-sync preparation: `save_merged` (LoRA merged into bf16 full weights, or the full weights, to
  `model.safetensors` on tmpfs), split into the gather (GPU -> CPU, bf16) and the serialisation, and
  `save_weights` (the LoRA adapter alone). No vLLM is there to receive them (its wheel does not travel), so the
  load on the vLLM side is not measured;
- TRL 1.16 `GRPOTrainer`: the same LoRA, bf16 (fp32 weights, autocast), one micro-batch of 16, no gradient
  checkpointing, generation by transformers (`min_new_tokens = max_new_tokens = --tokens`); its step split into
  generation (its `_generate`) and the rest ("train").
Tokens/s counts the tokens the model runs over (every row's real tokens; ours holds a group's shared prompt once, so
fewer than TRL's 16 x (prompt + completion)). MFU = 6 * N * tokens / seconds / peak, N the model's parameters (the
tied embedding once; attention's score FLOPs left out), the peak bf16 dense FLOP/s of the card (`PEAK_FLOPS`); a
LoRA step does ~4N per token (no weight gradient for the frozen weights), so its 6N figure is "model FLOPs" as
the convention counts them, not the work done.

    python benchmarks/gpu_trainer_step.py [--tokens 48 256] [--steps 5]        # on a GPU machine
    python benchmarks/gpu_trainer_step.py --tiny --tokens 8 --steps 1          # a CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from trainer_step import batch  # the benchmark beside this one: its reverse-text-shaped batch

RESULT = "RESULT "
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 FLOP/s by card (NVIDIA's data sheets, SXM, without sparsity)."""
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
"""`--tiny`: a model small enough to check the script on a CPU."""


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_mb() -> float:
    """This process's peak GPU memory allocated by torch (NaN on a CPU)."""
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else float("nan")


def reset_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def random_model(model_dir: str, tiny: bool) -> Any:
    """The architecture of `model_dir`'s config with random float32 weights (seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    for key, value in (TINY if tiny else {}).items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def parameters(model: torch.nn.Module) -> int:
    """Parameters, each tied tensor once (LoRA's left out)."""
    seen = {id(p): p.numel() for n, p in model.named_parameters(remove_duplicate=True) if "lora_" not in n}
    return sum(seen.values())


def real_tokens(mask: torch.Tensor) -> int:
    """The real (not padding) tokens of a micro-batch: its [B, T] mask, or the diagonal of its [B, 1, T, T] one
    (every real token attends to itself)."""
    return int((mask if mask.dim() == 2 else mask.diagonal(dim1=-2, dim2=-1)).sum())


def our_setting(args: argparse.Namespace, tokens: int, lora: bool, micro_tokens: int | None) -> dict[str, Any]:
    """Our trainer's steps at one setting, then its weight-sync preparation."""
    from tracegym.train.data_parallel import DataParallel
    from tracegym.train.trainer import TrainerConfig, make_trainer

    reset_peak()
    model = random_model(args.model_dir, args.tiny)
    n_params = parameters(model)
    options: dict[str, Any] = {"micro_batch_tokens": micro_tokens} if micro_tokens else {}
    config = TrainerConfig(model=args.model_dir, lora=lora, learning_rate=2e-4 if lora else 1e-5, **options)
    trainer = make_trainer(model, config, pad_id=0, dp=DataParallel(device=device()))
    samples = batch(tokens=tokens)
    ran = sum(real_tokens(b.attention_mask) for b in trainer._micro_batches(samples))
    seconds = []
    for step in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        metrics = trainer.step(samples)
        sync()
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
    row = {"side": "ours", "setting": ("LoRA" if lora else "full") + f", {config.micro_batch_tokens}-token "
           f"micro-batches", "tokens": tokens, "step_s": statistics.fmean(seconds),
           "train_s": statistics.fmean(seconds), "tokens_run": ran, "sample_tokens": sum(len(s) for s in samples),
           "micro_batches": metrics["micro_batches"], "params": n_params, "peak_mb": peak_memory_mb(),
           "bf16": trainer.bfloat16}
    return row | sync_preparation(trainer)


def sync_preparation(trainer: Any) -> dict[str, float]:
    """Seconds of the weight-sync preparation after a step: the gather of the served weights to the CPU in bf16,
    its serialisation, `save_merged` whole (both), and the adapter alone (`save_weights`, LoRA)."""
    from safetensors.torch import save_file

    from tracegym.train.trainer import _checkpoint_name, _lora_layers, _merged

    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=root) as tmp, torch.no_grad():
        sync()
        start = time.perf_counter()
        layers = _lora_layers(trainer.model) if trainer.is_lora else {}
        weights = {_checkpoint_name(n): _merged(p.detach(), layers.get(n)).to(torch.bfloat16).contiguous().cpu()
                   for n, p in trainer.model.named_parameters() if "lora_" not in n}
        gathered = time.perf_counter()
        save_file(weights, str(Path(tmp) / "gathered.safetensors"))
        serialised = time.perf_counter()
        trainer.save_merged(Path(tmp) / "merged")
        merged = time.perf_counter()
        flat = flat_gather(trainer, layers)
        adapter = float("nan")
        if trainer.is_lora:
            trainer.save_weights(Path(tmp) / "adapter")
            adapter = time.perf_counter() - merged
            adapter_mb = sum(f.stat().st_size for f in (Path(tmp) / "adapter").glob("*.safetensors")) / 2**20
        size = (Path(tmp) / "merged" / "model.safetensors").stat().st_size / 2**20
    return {"gather_s": gathered - start, "serialise_s": serialised - gathered, "save_merged_s": merged - serialised,
            "flat_gather_s": flat,
            "save_adapter_s": adapter, "merged_mb": size, "adapter_mb": adapter_mb if trainer.is_lora else 0.0}


def flat_gather(trainer: Any, layers: dict[str, Any]) -> float:
    """Seconds of the gather done in one copy: every served weight (merged) cast into one flat bf16 buffer on the
    device, copied once into pinned host memory (what a sync that streams the weights would start from)."""
    from tracegym.train.trainer import _merged

    params = [(n, p) for n, p in trainer.model.named_parameters() if "lora_" not in n]
    total = sum(p.numel() for _, p in params)
    host = torch.empty(total, dtype=torch.bfloat16, pin_memory=torch.cuda.is_available())
    sync()
    start = time.perf_counter()
    buffer = torch.empty(total, dtype=torch.bfloat16, device=params[0][1].device)
    offset = 0
    for name, param in params:
        size = param.numel()
        buffer[offset:offset + size].copy_(_merged(param.detach(), layers.get(name)).view(-1))
        offset += size
    host.copy_(buffer)
    sync()
    return time.perf_counter() - start


def our_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for tokens in args.tokens:
        for lora, micro in ((True, None), (True, args.gpu_micro_tokens), (False, args.gpu_micro_tokens)):
            rows.append(our_setting(args, tokens, lora, micro))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def prompts(count: int, seed: int) -> list[str]:
    """Reverse-text-like prompts (random words, ~35 tokens each)."""
    rng = random.Random(seed)
    words = ["river", "stone", "quiet", "lamp", "orange", "window", "paper", "cloud", "music", "garden", "silver"]
    return [f"Reverse the text character by character: {' '.join(rng.choices(words, k=12))}" for _ in range(count)]


def trl_setting(args: argparse.Namespace, tokens: int) -> dict[str, Any]:
    """TRL's GRPOTrainer steps at `tokens` completion tokens: generation and the rest of each step."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    reset_peak()
    total = args.warmup + args.steps
    tasks = 4
    model = random_model(args.model_dir, args.tiny)
    n_params = parameters(model)
    dataset = Dataset.from_list([{"prompt": p} for p in prompts(tasks * total, seed=tokens)])

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [len(set(c)) / (1 + len(c)) for c in completions]

    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=16, gradient_accumulation_steps=1,
                            num_generations=4, max_completion_length=tokens,
                            generation_kwargs={"min_new_tokens": tokens}, max_steps=total, learning_rate=2e-4,
                            shuffle_dataset=False, use_cpu=not gpu, bf16=gpu, save_strategy="no",
                            report_to="none", logging_steps=1, temperature=1.0)
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=LORA_MODULES, task_type="CAUSAL_LM")
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                              reward_funcs=[reward], peft_config=lora)
        steps: list[dict[str, float]] = []
        clock = {"generation": 0.0, "completion": 0.0, "prompt": 0.0}
        generate = trainer._generate

        def timed_generate(batch_prompts: list[Any]) -> Any:
            sync()
            start = time.perf_counter()
            out = generate(batch_prompts)
            sync()
            clock["generation"] += time.perf_counter() - start
            clock["prompt"] += float(sum(len(ids) for ids in out[0]))
            clock["completion"] += float(sum(len(ids) for ids in out[1]))
            return out

        trainer._generate = timed_generate

        class StepClock(TrainerCallback):
            def on_step_begin(self, *_: Any, **__: Any) -> None:
                sync()
                clock.update(generation=0.0, completion=0.0, prompt=0.0, start=time.perf_counter())

            def on_step_end(self, *_: Any, **__: Any) -> None:
                sync()
                took = time.perf_counter() - clock["start"]
                steps.append({"total": took, "generation": clock["generation"], "train": took - clock["generation"],
                              "tokens_run": clock["prompt"] + clock["completion"]})

        trainer.add_callback(StepClock())
        trainer.train()
    measured = steps[args.warmup:]
    return {"side": "trl", "setting": "LoRA, 16-row micro-batch", "tokens": tokens,
            "step_s": statistics.fmean(s["total"] for s in measured),
            "generation_s": statistics.fmean(s["generation"] for s in measured),
            "train_s": statistics.fmean(s["train"] for s in measured),
            "tokens_run": statistics.fmean(s["tokens_run"] for s in measured), "params": n_params,
            "peak_mb": peak_memory_mb(), "bf16": gpu}


def trl_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [trl_setting(args, tokens) for tokens in args.tokens]


SIDES = {"ours": our_side, "trl": trl_side}


def run_side(side: str, args: argparse.Namespace) -> list[dict[str, Any]] | str:
    """One side in a subprocess of its own: its rows, or why it failed (the other side still reports)."""
    flags = ["--model-dir", args.model_dir, "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--gpu-micro-tokens", str(args.gpu_micro_tokens), "--tokens", *map(str, args.tokens)]
    flags += ["--tiny"] if args.tiny else []
    done = subprocess.run([sys.executable, __file__, "--side", side, *flags], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return f"{side} failed ({done.returncode}): {done.stderr[-2500:]}"
    return list(json.loads(lines[-1].removeprefix(RESULT)))


def figures(row: dict[str, Any], peak: float | None) -> dict[str, Any]:
    """The row's tokens/s over its trained part, and MFU (6N per token) where the card's peak is known."""
    per_s = row["tokens_run"] / row["train_s"]
    mfu = 6 * row["params"] * per_s / peak if peak else float("nan")
    return row | {"tokens_per_s": per_s, "mfu": mfu}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'side':<5} {'setting':<34}{'tok':>5}{'step s':>8}{'gen s':>7}{'train s':>8}{'tok run':>8}"
          f"{'tok/s':>10}{'MFU':>7}{'peak MiB':>10}")
    for r in rows:
        print(f"{r['side']:<5} {r['setting']:<34}{r['tokens']:>5}{r['step_s']:>8.3f}{r.get('generation_s', 0):>7.3f}"
              f"{r['train_s']:>8.3f}{r['tokens_run']:>8.0f}{r['tokens_per_s']:>10.0f}{100 * r['mfu']:>6.1f}%"
              f"{r['peak_mb']:>10.0f}")
    print(f"\n{'weight-sync preparation (ours)':<40}{'tok':>5}{'gather s':>9}{'write s':>9}{'save_merged s':>14}"
          f"{'MB':>6}{'adapter s':>10}{'MB':>6}{'merged/step':>12}{'flat gather s':>14}")
    for r in (r for r in rows if r["side"] == "ours"):
        print(f"{r['setting']:<40}{r['tokens']:>5}{r['gather_s']:>9.3f}{r['serialise_s']:>9.3f}"
              f"{r['save_merged_s']:>14.3f}{r['merged_mb']:>6.0f}{r['save_adapter_s']:>10.3f}{r['adapter_mb']:>6.1f}"
              f"{r['save_merged_s'] / r['step_s']:>11.0%}{r['flat_gather_s']:>14.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="a folder with the model's config.json and tokenizer (default: the "
                                            "embedded model's)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[48, 256], help="tokens in every completion")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per setting")
    parser.add_argument("--warmup", type=int, default=2, help="steps each setting runs first, not measured")
    parser.add_argument("--gpu-micro-tokens", type=int, default=16384,
                        help="our second micro-batch token budget (one micro-batch for the whole step)")
    parser.add_argument("--sides", nargs="+", choices=sorted(SIDES), default=["ours", "trl"])
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same kind (a CPU check)")
    parser.add_argument("--json", help="also write every row here")
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model_dir is None:
        from tracegym.models.embedded import embedded_model_dir

        args.model_dir = str(embedded_model_dir())
    if args.side:
        print(RESULT + json.dumps(SIDES[args.side](args)), flush=True)
        return
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    peak = next((flops for card, flops in PEAK_FLOPS.items() if card in name), None)
    print(f"device: {name}; torch {torch.__version__}; peak bf16 {peak and peak / 1e12} TFLOP/s", flush=True)
    rows: list[dict[str, Any]] = []
    for side in args.sides:
        got = run_side(side, args)
        if isinstance(got, str):
            print(got, flush=True)
            continue
        rows += [figures(r, peak) for r in got]
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
