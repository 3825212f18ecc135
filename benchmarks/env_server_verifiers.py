"""Benchmark driver: verifiers' own env server (its ZMQ env server, router and workers) and verifiers in process, one
load level at a time, against a running fake OpenAI endpoint; one JSON line per path and level on stdout.

Run by `benchmarks/env_server.py --curve` with whichever interpreter has verifiers (`--verifiers-python`): it imports
nothing of tracegym, so verifiers may live in a venv of its own. The environment is a SingleTurnEnv of 100 echo
prompts with one reward, like tracegym's echo taskset; each rollout is one `run_rollout` (one request through the
server, as `per call` 1 on our side), timed as its caller sees it.

    python benchmarks/env_server_verifiers.py --base-url http://127.0.0.1:PORT/v1 --levels 1 8 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENVIRONMENT = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    rows = [{"question": f"Repeat after me: item {i}", "answer": f"item {i}"} for i in range(100)]

    def echoed(completion, answer) -> float:
        return float(answer in completion[-1]["content"])

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[echoed]))
'''
MODULE = "tracegym_bench_echo"


async def drive(call: Any, inputs: list[dict], concurrency: int, total: int, cap_s: float) -> dict[str, Any]:
    """`concurrency` callers run one rollout at a time until `total` are done or `cap_s` seconds have passed."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(total))
    deadline = time.perf_counter() + cap_s

    async def caller() -> None:
        nonlocal errors
        for n in counter:
            if time.perf_counter() > deadline:
                return
            start = time.perf_counter()
            try:
                output = await call(inputs[n % len(inputs)])
                errors += output.get("error") is not None  # a rollout verifiers caught an error in: data, as ours
            except Exception:  # a failed request, as our side's failed traces
                errors += 1
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"rollouts": len(latencies), "rate": len(latencies) / elapsed, "p50_ms": statistics.median(latencies) * 1e3,
            "p99_ms": cuts[98] * 1e3, "errors": errors, "capped": len(latencies) < total}


async def level(env: Any, client: Any, inputs: list[dict], concurrency: int, total: int, cap_s: float,
                warm: int, rounds: int) -> dict[str, Any]:
    """A warm-up, then `rounds` bounded measurements: their median rate and latencies, failures summed."""
    sampling = {"max_tokens": 32}

    async def call(row: dict) -> Any:
        return await env.run_rollout(row, client, "fake-model", sampling)

    await drive(call, inputs, concurrency, warm, cap_s / 4)
    runs = [await drive(call, inputs, concurrency, total, cap_s) for _ in range(rounds)]
    median = {key: statistics.median(run[key] for run in runs) for key in ("rate", "p50_ms", "p99_ms")}
    return {**median, "rollouts": sum(run["rollouts"] for run in runs), "errors": sum(run["errors"] for run in runs),
            "capped": any(run["capped"] for run in runs)}


async def main(args: argparse.Namespace) -> None:
    import verifiers as vf
    from verifiers.clients import resolve_client
    from verifiers.types import ClientConfig

    folder = Path(tempfile.mkdtemp(prefix="tracegym-vf-"))
    (folder / f"{MODULE}.py").write_text(ENVIRONMENT)
    sys.path.insert(0, str(folder))  # the server's spawned processes get our sys.path
    env = vf.load_environment(MODULE)
    inputs = [{"prompt": row["prompt"], "answer": row["answer"], "example_id": i}
              for i, row in enumerate(env.get_eval_dataset())]
    config = ClientConfig(api_base_url=args.base_url, api_key_var="TRACEGYM_BENCH_NO_KEY", max_retries=0)
    print(json.dumps({"version": vf.__version__}), flush=True)
    shared = resolve_client(config)  # in process: one client for every rollout (as its server's workers keep one)
    for path in args.paths:
        if path == "server":
            await env.start_server(num_workers=args.workers, console_logging=False, log_level="WARNING")
        client = config if path == "server" else shared  # the server is sent the config, as verifiers requires
        try:
            for c in args.levels:
                total = max(args.min_rollouts, args.per_level * c)
                result = await level(env, client, inputs, c, total, args.cap_s, min(total, max(50, 2 * c)), args.rounds)
                print(json.dumps({"path": path, "c": c, **result}), flush=True)
        finally:
            if path == "server":
                await env.stop_server()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the fake OpenAI endpoint, http://HOST:PORT/v1")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 64, 128, 512, 1024])
    parser.add_argument("--paths", nargs="+", choices=["in-process", "server"], default=["in-process", "server"])
    parser.add_argument("--workers", type=int, default=2, help="workers of verifiers' env server")
    parser.add_argument("--min-rollouts", type=int, default=500)
    parser.add_argument("--per-level", type=int, default=3, help="rollouts per level: this many per caller")
    parser.add_argument("--cap-s", type=float, default=20.0, help="most seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per level (the median is kept)")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TRACEGYM_BENCH_NO_KEY", "none")  # the fake endpoint takes any key
    asyncio.run(main(parser.parse_args()))
