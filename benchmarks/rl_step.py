"""Benchmark: seconds per RL step (generation / training / weight sync) and peak memory, SmolLM2-135M with LoRA.

One step: 16 completions of at most 48 tokens (4 reverse-text tasks x 4 rollouts, new tasks every step) from
vLLM through the ChatClient (exact token ids and logprobs returned); group-mean advantages; one trainer step
(LoRA r=16, AdamW) in this process; then the new weights reach vLLM: the adapter loaded in place
(`--sync lora`), or served merged (on this CPU vLLM generates ~3x faster without an adapter): vLLM merges the
adapter into the base weights it keeps (`--sync merged`, the default, as `tracegym rl`), or reloads merged full
weights the trainer writes (`--sync merged-file`). Steps run one after the other (on-policy): on 2 cores
generation and training would only fight for them. Peak memory: this (trainer) process's peak RSS and vLLM's
processes' (API server + engine core), each read from the kernel's high-water mark at the end. vLLM's
CPU KV cache is 0.5 GiB as in `tracegym rl` (`--kv-cache-gib`). Steps never overlap here, so vLLM runs its
model worker inside its engine process (`cpu_one_process`, faster when it has the cores to itself; not
`tracegym rl`'s default, where generation overlaps training: `--vllm-worker-process` measures that setting).
Anchor (issue 7): TRL 1.16 GRPOTrainer 17.2 s/step at its best setting, 1.95 GB peak. Target: <= 8.6 s.
`rl_step_vs_trl.py` runs this step beside TRL's at equal work.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/rl_step.py [--sync merged|lora] [--steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from tracegym import Endpoint, Sampling, evaluate
from tracegym.core.episode import Episode
from tracegym.core.sample import Sample
from tracegym.core.trace import Trace
from tracegym.envs.registry import load_taskset
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.fan_out import advantaged, episode_units
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import Trainer, TrainerConfig, build_trainer
from tracegym.train.weight_sync import MergedWeightSync, WeightSync

TARGET_S = 8.6


def samples_of(traces: list[Trace], advantages: GroupAdvantages, version: int) -> tuple[list[Sample], list[float]]:
    """Training samples of the traces as the orchestrator makes them (`train.fan_out`): per task, the rollouts
    that failed outside the model or went unscored are left out of the group, advantages come from the others'
    rewards (groups without signal dropped); and the rewards of the rollouts that trained (the orchestrator's
    `reward` metric is over those)."""
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(trace.task_key, []).append(trace)
    out, rewards = [], []
    for group in groups.values():
        units, _ = episode_units(Episode.solo(t) for t in group)  # each rollout as the env server returns it
        rewards += [unit.reward for unit in units]
        for unit, value in advantaged(units, advantages):
            out += [s.model_copy(update={"advantage": value, "policy_version": version})
                    for s in trace_samples(unit.trace)]
    return out, rewards


async def one_step(step: int, args: argparse.Namespace, client: ChatClient, trainer: Trainer, sync: WeightSync,
                   adapters: Path, vllm_pid: int | None = None) -> dict[str, float]:
    """Generate, train, publish; the seconds of each part and the step's numbers."""
    taskset = load_taskset("reverse-text", {"seed": 1000 + step})
    sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens, extra=fixed_length(args.max_tokens)
                        if args.fixed_length else {})
    t0 = time.perf_counter()
    traces = await evaluate(taskset, client, num_tasks=args.tasks, rollouts=args.rollouts, sampling=sampling)
    t1 = time.perf_counter()
    batch, rewards = samples_of(traces, GroupAdvantages(), trainer.version)
    cpu = (own_cpu_seconds(), group_cpu_seconds(vllm_pid))
    metrics = trainer.step(batch) if batch else {}
    t2 = time.perf_counter()
    busy = {"trainer_cores": (own_cpu_seconds() - cpu[0]) / (t2 - t1),
            "vllm_cores_in_training": (group_cpu_seconds(vllm_pid) - cpu[1]) / (t2 - t1)}
    sync.publish(save_for(args, trainer, adapters), trainer.version)
    t3 = time.perf_counter()
    return {"generation": t1 - t0, "training": t2 - t1, "weight_sync": t3 - t2, "total": t3 - t0,
            "sync_save": t3 - t2 - sync.last_seconds, "sync_load": sync.last_seconds,
            "completion_tokens": float(sum(t.completion_length for t in traces)),
            "reward": statistics.fmean(rewards) if rewards else float("nan"), "samples": float(len(batch)),
            "rollouts_failed": float(len(traces) - len(rewards)),
            "ratio": metrics.get("ratio_mean", float("nan")), "abs_log_ratio": metrics.get("abs_log_ratio_mean", 0.0),
            **busy}


def fixed_length(tokens: int) -> dict[str, object]:
    """vLLM's request fields that make every completion exactly `tokens` long (EOS and stop tokens ignored)."""
    return {"min_tokens": tokens, "ignore_eos": True}


def save_for(args: argparse.Namespace, trainer: Trainer, folder: Path) -> Path:
    """What the sync publishes: the adapter (`--sync lora`, and `--sync merged`, where vLLM merges it in, as
    `tracegym rl` does), or the merged weights (`--sync merged-file`; all but the frozen embeddings, which vLLM
    holds already)."""
    if args.sync == "merged-file":
        return trainer.save_merged(folder / "merged", changed_only=True)
    return trainer.save_weights(folder / "current")


def group_peak_rss_mb(pid: int | None) -> float:
    """Summed peak RSS (VmHWM, MB) of every process in the process group led by `pid` (the torch libraries each
    of them maps count once per process)."""
    if pid is None:
        return float("nan")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pid:
                total += _status_kb(stat.parent / "status", "VmHWM")
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024


def group_cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by every process in the process group led by `pid`."""
    if pid is None:
        return float("nan")
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pid:
                ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds (user + system) this process has used so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _status_kb(status: Path, key: str) -> int:
    for line in status.read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


class PeakMemory:
    """Peak RSS of this (trainer) process and of vLLM's processes, read once at the end from the kernel's own
    high-water marks. (Sampling PSS every 0.2 s in a thread, as this benchmark once did, made the steps 30%
    slower: reading a 2 GB process's smaps_rollup walks its page tables.)"""

    def __init__(self, vllm_pid: int | None) -> None:
        self.vllm_pid, self.vllm, self.trainer = vllm_pid, float("nan"), float("nan")

    def stop(self) -> PeakMemory:
        self.vllm = group_peak_rss_mb(self.vllm_pid)
        self.trainer = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return self


async def run(args: argparse.Namespace) -> tuple[list[dict[str, float]], PeakMemory]:
    """Warm-up and measured steps; returns the measured steps and the peak memory while they ran."""
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, lora_rank=args.rank, lora_alpha=2 * args.rank,
                                          learning_rate=args.lr, num_threads=args.threads,
                                          compile=args.trainer_compile,
                                          **({"micro_batch_tokens": args.micro_batch_tokens}
                                             if args.micro_batch_tokens else {})))
    lora = args.sync == "lora"
    server_config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=1024,
                                     enable_lora=lora, max_lora_rank=args.rank, dtype=args.vllm_dtype,
                                     cpu_kv_cache_gib=args.kv_cache_gib, cpu_one_process=not args.vllm_worker_process,
                                     enforce_eager=not args.vllm_compile, merge_adapters=args.sync == "merged",
                                     env={} if lora else {"VLLM_SERVER_DEV_MODE": "1"})
    with tempfile.TemporaryDirectory(prefix="tracegym-rl-bench-") as tmp, VLLMServer(server_config) as server:
        sync = WeightSync(server.base_url) if lora else MergedWeightSync(server.base_url, SERVED_MODEL_NAME,
                                                                         model_dir)
        sync.publish(save_for(args, trainer, Path(tmp)), trainer.version)
        endpoint = Endpoint(base_url=server.base_url, model=sync.model_name, api_key_env=None, tokens="on")
        rows, memory = [], PeakMemory(server.pid)
        async with ChatClient(endpoint) as client:
            for step in range(args.warmup + args.steps):
                row = await one_step(step, args, client, trainer, sync, Path(tmp), server.pid)
                print(f"step {step}{' (warm-up)' if step < args.warmup else ''}: " +
                      "  ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
                if step >= args.warmup:
                    rows.append(row)
        return rows, memory.stop()


def print_table(rows: list[dict[str, float]], memory: PeakMemory) -> None:
    print(f"\nRL step, {len(rows)} measured steps (mean / min / max seconds)")
    print(f"{'part':<14}{'mean':>8}{'min':>8}{'max':>8}")
    for part in ("generation", "training", "weight_sync", "sync_save", "sync_load", "total"):
        values = [r[part] for r in rows]
        print(f"{part:<14}{statistics.fmean(values):>8.2f}{min(values):>8.2f}{max(values):>8.2f}")
    tokens = statistics.fmean(r["completion_tokens"] for r in rows)
    mismatch = statistics.fmean(r["abs_log_ratio"] for r in rows)
    print(f"completion tokens per step: {tokens:.0f}; mean |trainer - sampler logprob| per token: {mismatch:.4f}")
    print(f"peak memory: trainer process {memory.trainer:.0f} MB RSS; vLLM's processes {memory.vllm:.0f} MB RSS "
          "(each one's peak, summed)")
    mean_total = statistics.fmean(r["total"] for r in rows)
    print(f"target <= {TARGET_S} s per step: {'met' if mean_total <= TARGET_S else 'NOT met'} ({mean_total:.2f} s)")


def arguments() -> argparse.ArgumentParser:
    """The benchmark's flags (also how `rl_step_vs_trl.py` configures the steps it runs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="measured steps")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not measured")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per task")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion tokens at most")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=2e-4, help="learning rate")
    parser.add_argument("--threads", type=int, default=2, help="trainer torch threads")
    parser.add_argument("--sync", choices=["lora", "merged", "merged-file"], default="merged",
                        help="publish the LoRA adapter; or serve it merged: vLLM merges it in place (merged), or "
                             "reloads merged full weights the trainer writes (merged-file)")
    parser.add_argument("--kv-cache-gib", type=float, default=0.5, help="vLLM's CPU KV cache (as `tracegym rl`)")
    parser.add_argument("--vllm-worker-process", action="store_true",
                        help="vLLM's model worker in a process of its own (the default elsewhere; slower here)")
    parser.add_argument("--vllm-dtype", default="auto", help="vLLM dtype (auto: bfloat16 on CPU)")
    parser.add_argument("--vllm-compile", action="store_true",
                        help="vLLM compiles its model (torch.compile; ~50 s more to start) instead of running eagerly")
    parser.add_argument("--trainer-compile", action="store_true",
                        help="the trainer compiles its decoder layers (TrainerConfig.compile; ~25 s at the first step)")
    parser.add_argument("--micro-batch-tokens", type=int,
                        help="the trainer's micro-batch token budget (default: TrainerConfig's)")
    parser.add_argument("--fixed-length", action="store_true",
                        help="every completion exactly --max-tokens long (vLLM's min_tokens + ignore_eos)")
    return parser


def main() -> None:
    args = arguments().parse_args()
    rows, memory = asyncio.run(run(args))
    print_table(rows, memory)


if __name__ == "__main__":
    main()
