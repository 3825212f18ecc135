"""Benchmark: the CPU vLLM's message-queue spin (`VLLMServerConfig.cpu_queue_spin_s`), vLLM's own 1 s against 0,
side by side in one run, alone and beside a one-thread trainer-like load.

vLLM as `tracegym rl` starts it (model worker in a process of its own) generates a reverse-text step's rollouts (4
prompts x 4 rollouts, exactly 48 tokens) through the real server and chat client. For each setting it prints
seconds per step, the cores each vLLM process used meanwhile (from /proc), and, with `load`, the share of a core
a busy one-thread torch matmul loop beside it got (what a trainer would). Then vLLM's message queue alone, between
two processes: the latency of 3,000 messages sent at random gaps (0-80 ms, as decode steps come), under vLLM's spin
and under ours (no spin, a recheck every `vllm_plugin.RECHECK_MS`), which shows what a lost wake-up costs.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/vllm_queue_spin.py [--reps 2] [--steps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vllm_block_size import seconds  # the benchmark beside this one: its reverse-text step

from tracegym import Endpoint
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_plugin import set_queue_spin
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

LOAD = "import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a"
SETTINGS = {"vLLM's 1 s": None, "0 s": 0.0}


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


def cpu_seconds(pid: int) -> tuple[str, float]:
    """A process's name and the CPU seconds it has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?", 0.0
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(spin: float | None, load: bool, args: argparse.Namespace) -> dict[str, float]:
    """Seconds per step, cores per vLLM process and the load's share of a core, on a server of its own."""
    config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                              max_model_len=1024, cpu_kv_cache_gib=0.5, cpu_queue_spin_s=spin)
    with VLLMServer(config) as server:
        async with ChatClient(Endpoint(base_url=server.base_url, model=SERVED_MODEL_NAME)) as client:
            await seconds(client, args.tokens, step=0, args=args)
            hog = subprocess.Popen([sys.executable, "-c", LOAD]) if load else None
            try:
                time.sleep(1.0)
                pids = descendants(server.pid or 0)
                before = {pid: cpu_seconds(pid)[1] for pid in [*pids, *([hog.pid] if hog else [])]}
                start = time.perf_counter()
                steps = [await seconds(client, args.tokens, step, args) for step in range(1, args.steps + 1)]
                wall = time.perf_counter() - start
                used = {pid: cpu_seconds(pid) for pid in before}
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
    out = {"s/step": statistics.fmean(steps)}
    for pid in pids:
        name, total = used[pid]
        if total - before[pid] > 0.01 * wall:
            out[f"{name} cores"] = (total - before[pid]) / wall
    if hog:
        out["load's share"] = (used[hog.pid][1] - before[hog.pid]) / wall
    return out


def read_queue(handle: object, spin: float | None, count: int, out: multiprocessing.Queue) -> None:
    """The reader's side: `count` messages (each its send time); their latencies."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    if spin is not None:
        set_queue_spin(spin)
    queue = MessageQueue.create_from_handle(handle, 0)
    queue.wait_until_ready()
    latencies = []
    for _ in range(count):
        sent = queue.dequeue()
        latencies.append(time.time() - sent)
    out.put(latencies)


def queue_latency(spin: float | None, count: int) -> dict[str, float]:
    """Median, 99th percentile and largest latency (ms) of `count` messages through vLLM's queue."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    context = multiprocessing.get_context("spawn")
    queue, out = MessageQueue(1, 1), context.Queue()
    reader = context.Process(target=read_queue, args=(queue.export_handle(), spin, count, out))
    reader.start()
    queue.wait_until_ready()
    gaps = random.Random(0)
    for _ in range(count):
        time.sleep(gaps.choice([0, 0, 0.0005, 0.002, 0.02, 0.08]))
        queue.enqueue(time.time())
    latencies = sorted(out.get())
    reader.join()
    return {"median ms": 1e3 * latencies[count // 2], "p99 ms": 1e3 * latencies[int(0.99 * count)],
            "max ms": 1e3 * latencies[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="rounds over every setting")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per setting and round")
    parser.add_argument("--tasks", type=int, default=4, help="prompts per step")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--tokens", type=int, default=48, help="tokens in every completion")
    parser.add_argument("--messages", type=int, default=3000, help="messages through the bare queue per setting")
    args = parser.parse_args()
    for rep in range(1, args.reps + 1):
        for load in (False, True):
            for label, spin in SETTINGS.items():
                figures = asyncio.run(measure(spin, load, args))
                shown = "  ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"rep {rep}  {'beside a load' if load else 'alone':<14} spin {label:<11} {shown}", flush=True)
        for label, spin in SETTINGS.items():
            shown = "  ".join(f"{k} {v:.2f}" for k, v in queue_latency(spin, args.messages).items())
            print(f"rep {rep}  queue latency  spin {label:<11} {shown}", flush=True)


if __name__ == "__main__":
    main()
