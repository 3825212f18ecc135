"""Benchmark: trainer step time and peak memory at 1 and 2 data-parallel processes on the same batch.

The batch is one step of the shipped reverse-text config's size (32 samples of a ~60-token prompt and a completion
of up to 48 tokens; random token ids, fixed seed, the sampler's logprobs set to the trainer's own so no token is
masked) and the trainer is that config's [trainer] section on the embedded SmolLM2-135M (LoRA r=16, the default
compute dtype: float32 on a CPU, 512-token micro-batches), or full weights with `--full`. Each setting runs in
fresh processes under tcmalloc, as `tracegym rl` starts the trainer: alone, then under torchrun (`gloo` on CPU,
`nccl` on GPU), one warm-up step and `--steps` timed ones. On CPU every process gets `--threads` torch threads
(default 1), so 2 ranks use twice the cores of one: the ratio is the data-parallel speed-up and its cost in memory
(one thread per process also keeps OpenMP's spinning threads from collapsing a step on a busy machine). Step time
is the slowest rank's, median over the timed steps. Peak memory is each process's peak RSS on CPU (VmHWM, read at
each phase and reset after it, so `--phases` prints where the peak is: after the build, the first logprobs, each
micro-batch's forward and backward), and the peak CUDA memory allocated by each rank on a GPU.

    flock /work/heavy.lock .venv/bin/python benchmarks/trainer_dp.py [--steps 3] [--full] [--threads 1] [--phases]
    python benchmarks/trainer_dp.py --device cuda            # on a GPU machine (2 ranks need 2 GPUs); bf16
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
import tomllib
from pathlib import Path

import torch

from tracegym.core.sample import Sample
from tracegym.train.malloc import malloc_env

SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "rl" / "reverse_text.toml"


def batch(seed: int = 0, samples: int = 32, prompt: int = 60, completion: int = 48) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        p, c = prompt + rng.randint(-8, 8), rng.randint(completion // 2, completion)
        mask = [False] * p + [True] * c
        out.append(Sample(token_ids=[rng.randrange(49152) for _ in mask], loss_mask=mask,
                          logprobs=[-2.0 if m else 0.0 for m in mask], advantage=rng.uniform(-1, 1)))
    return out


def on_policy(samples: list[Sample], logprobs: list[list[float]]) -> list[Sample]:
    """The samples as if this policy had sampled them (its own logprobs: importance ratio 1, no token masked)."""
    return [s.model_copy(update={"logprobs": lp}) for s, lp in zip(samples, logprobs, strict=True)]


def status_mib(field: str) -> float:
    """A figure of this process's /proc/self/status (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


class Phases:
    """This process's resident memory at named points and its peak since the point before (Linux: the peak is
    reset through /proc/self/clear_refs at each point)."""

    def __init__(self) -> None:
        self.points: list[tuple[str, float, float]] = []
        self.mark("imports")

    def mark(self, name: str) -> None:
        self.points.append((name, round(status_mib("VmRSS")), round(status_mib("VmHWM"))))
        Path("/proc/self/clear_refs").write_text("5")

    def watch(self, trainer: object) -> None:
        """Mark each micro-batch's forward (with the loss) and, at the next one, the backward before it."""
        loss = trainer._loss  # type: ignore[attr-defined]

        def marked(*a: object, **k: object) -> object:
            self.mark("before forward (peak: backward before)")
            out = loss(*a, **k)
            self.mark("forward + loss")
            return out

        trainer._loss = marked  # type: ignore[attr-defined]


def worker(out: Path, args: argparse.Namespace) -> None:
    """One process: train the same batch `args.steps + 1` times, write its timings and peak memory."""
    phases = Phases()
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.train.data_parallel import join
    from tracegym.train.trainer import TrainerConfig, build_trainer

    section = tomllib.loads(SHIPPED.read_text())["trainer"]
    config = TrainerConfig(**{**section, "model": args.model or str(embedded_model_dir()), "lora": not args.full,
                              "num_threads": args.threads, "device": args.device})
    phases.mark("tracegym imported")
    dp = join(config.device)
    phases.mark("process group joined")
    trainer = build_trainer(config, dp)
    phases.mark("trainer built")
    samples = on_policy(batch(), trainer.logprobs(batch()))
    phases.mark("logprobs")
    if args.phases:
        phases.watch(trainer)
    times, losses = [], []
    for _ in range(args.steps + 1):
        if dp.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = trainer.step(samples)
        if dp.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(metrics["loss"])
        phases.mark("step end (peak: last backward + optimizer)")
    peak = (torch.cuda.max_memory_allocated(dp.device) if dp.device.type == "cuda"
            else max(hwm for _, _, hwm in phases.points) * 2**20)  # clear_refs resets ru_maxrss too
    record = {"rank": dp.rank, "world": dp.world, "step_s": times[1:], "loss": losses, "peak_bytes": peak,
              "device": str(dp.device), "backend": torch.distributed.get_backend() if dp.world > 1 else "none",
              "phases": phases.points}
    (out / f"rank-{dp.rank}.json").write_text(json.dumps(record))
    dp.close()


def measure(processes: int, args: argparse.Namespace) -> list[dict]:
    """Run the worker as `processes` processes; their records."""
    with tempfile.TemporaryDirectory() as tmp:
        threads = args.threads
        me = [__file__, "--worker", tmp, "--steps", str(args.steps), "--device", args.device,
              "--threads", str(threads), *(["--full"] if args.full else []),
              *(["--model", args.model] if args.model else []), *(["--phases"] if args.phases else [])]
        command = [sys.executable, *me] if processes == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *me]
        env = malloc_env("tcmalloc", {**os.environ, "OMP_NUM_THREADS": str(threads)})  # as `tracegym rl` runs it
        subprocess.run(command, check=True, env=env)
        return [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="train every weight instead of a LoRA adapter")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of each process")
    parser.add_argument("--model", default=None, help="a model directory (default: the embedded SmolLM2-135M)")
    parser.add_argument("--phases", action="store_true", help="print each process's memory at each micro-batch")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args)
        return
    counts = [1, 2] if args.device == "cpu" or torch.cuda.device_count() >= 2 else [1]
    print(f"trainer step on {args.device}, {'full weights' if args.full else 'LoRA r=16'}, 32 samples, "
          f"{args.steps} timed steps after one warm-up, {args.threads} thread(s) per process", flush=True)
    rows = {}
    for n in counts:
        records = measure(n, args)
        step = statistics.median(max(r["step_s"][i] for r in records) for i in range(args.steps))
        peaks = [r["peak_bytes"] / 2**20 for r in records]
        rows[n] = (step, max(peaks), sum(peaks))
        for r in records:
            print(f"rank {r['rank']} of {r['world']}: " + "; ".join(f"{name} {rss}/{hwm}" for name, rss, hwm in
                                                                   r["phases"]), flush=True)
        print(f"{n} process(es), backend {records[0]['backend']}: step {step:.2f} s (median of the slowest rank), "
              f"peak {max(peaks):.0f} MiB per process, {sum(peaks):.0f} MiB in all, first loss "
              f"{records[0]['loss'][0]:.5f}", flush=True)
    if 2 in rows:
        print(f"2 vs 1 process: step time x{rows[2][0] / rows[1][0]:.2f}, peak memory per process "
              f"x{rows[2][1] / rows[1][1]:.2f}, in all x{rows[2][2] / rows[1][2]:.2f}")
    else:
        print("one GPU: only the 1-process figure (2 ranks need 2 GPUs)")


if __name__ == "__main__":
    main()
