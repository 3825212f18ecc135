"""Benchmark: generation of an RL step's rollouts under vLLM's CPU KV-cache block sizes, side by side in one run.

Prefix caching shares whole blocks only. A reverse-text step's 16 rollouts (4 prompts of ~45 chat-templated
tokens, 4 rollouts each, as `rl_step_vs_trl.py`) are generated through the real embedded vLLM server and the chat
client, once with 1 completion token (so the time is the prefill) and once with exactly 48. Each block size gets
its own server, started in turn for every round (`--reps`); every figure is the mean of `--steps` steps, each on
new prompts after a warm-up step. `VLLMServerConfig.cpu_block_size` takes the default from this.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/vllm_block_size.py [--reps 2] [--sizes 32 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from tracegym import Endpoint, Sampling, evaluate
from tracegym.envs.registry import load_taskset
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

LENGTHS = (1, 48)
"""Completion tokens: 1 (the prefill alone) and 48 (a reverse-text step's fixed length)."""


async def seconds(client: ChatClient, tokens: int, step: int, args: argparse.Namespace) -> float:
    """One step's rollouts of exactly `tokens` tokens on new prompts (seed 1000 + step); their wall time."""
    taskset = load_taskset("reverse-text", {"seed": 1000 + step})
    sampling = Sampling(temperature=1.0, max_tokens=tokens, extra={"min_tokens": tokens, "ignore_eos": True})
    start = time.perf_counter()
    await evaluate(taskset, client, num_tasks=args.tasks, rollouts=args.rollouts, sampling=sampling)
    return time.perf_counter() - start


async def measure(block_size: int, args: argparse.Namespace) -> dict[int, float]:
    """Mean seconds per step for each completion length, on a server of its own with `block_size`."""
    config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                              max_model_len=1024, cpu_kv_cache_gib=0.5, cpu_one_process=True,
                              cpu_block_size=block_size)
    out = {}
    with VLLMServer(config) as server:
        async with ChatClient(Endpoint(base_url=server.base_url, model=SERVED_MODEL_NAME)) as client:
            for tokens in LENGTHS:
                await seconds(client, tokens, step=0, args=args)
                out[tokens] = statistics.fmean([await seconds(client, tokens, step, args)
                                                for step in range(1, args.steps + 1)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="rounds over every block size")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per length, size and round")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 128], help="block sizes (multiples of 32)")
    parser.add_argument("--tasks", type=int, default=4, help="prompts per step")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt")
    args = parser.parse_args()
    rows = [(rep, size, asyncio.run(measure(size, args))) for rep in range(args.reps) for size in args.sizes]
    print(f"\n{'rep':<4}{'block':>6}" + "".join(f"{f'{n} tok s':>10}" for n in LENGTHS))
    for rep, size, figures in rows:
        print(f"{rep:<4}{size:>6}" + "".join(f"{figures[n]:>10.2f}" for n in LENGTHS))
    for n in LENGTHS:
        means = {size: statistics.fmean(f[n] for _, s, f in rows if s == size) for size in args.sizes}
        print(f"{n} token(s): " + ", ".join(f"block {s}: {m:.2f} s" for s, m in means.items()))


if __name__ == "__main__":
    main()
