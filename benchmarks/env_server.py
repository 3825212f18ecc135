"""Benchmark: rollouts/s and latency in process vs through the env server (static and elastic pools).

The echo taskset (tracegym.testing.echo) runs 1-turn and 5-turn rollouts against the fake OpenAI server in its
own process, answering at once, so the figures measure our plumbing. Every path is driven the same way:
`concurrency / per call` callers each run `per call` rollouts of one task at a time (one request through the
server; `asyncio.gather` in process) until `rollouts` are done; latency is per rollout as the caller sees it.
`per call` 1 is the worst case for the server (one request per rollout); 4 is what `tracegym eval -r 4` and
the RL orchestrator send (the env client puts a task's rollouts in one request). Peak RSS is the sum over
the server process and its workers, sampled every 50 ms.
Targets (issue 5): >= 400 single-turn rollouts/s at 128; p50 added latency <= 1.5 ms at 1; server >= 0.8x.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/env_server.py [--rollouts 5000] [--workers 2]

`--curve` measures the published curve instead (`env_server_curve.py`: c = 1 ... 1024, ours next to verifiers').
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fake_endpoint import fake_endpoint

from tracegym import Endpoint, Sampling, TaskData, Trace, run_rollout
from tracegym.core.episode import SOLO
from tracegym.models.chat_client import ChatClient
from tracegym.serve import EnvClient, local_server
from tracegym.testing.echo import SPEC, Echo

Call = Callable[[TaskData, list[int]], Awaitable[list[Trace]]]
SAMPLING = Sampling(max_tokens=32)
WARM_UP_S = 1.5
"""Seconds of rollouts before each measurement (not counted)."""


@dataclass
class Result:
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int


async def drive(call: Call, tasks: list[TaskData], concurrency: int, total: int, group: int = 1,
                deadline: float | None = None) -> Result:
    """`concurrency / group` callers each run `group` rollouts of one task at a time until `total` are done (or,
    with `deadline`, a `time.perf_counter()`, until then: no call starts past it); a rollout's latency is its
    group's."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(0, total, group))

    async def caller() -> None:
        nonlocal errors
        for n in counter:
            start = time.perf_counter()
            if deadline is not None and start > deadline:
                return
            traces = await call(tasks[n // group % len(tasks)], list(range(n, n + group)))
            latencies.extend([time.perf_counter() - start] * len(traces))
            errors += sum(0 if trace.ok else 1 for trace in traces)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(max(1, concurrency // group))))
    elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100)
    return Result(len(latencies) / elapsed, statistics.median(latencies) * 1e3, cuts[98] * 1e3, errors)


async def measure(make: Callable[[], tuple[Call, Callable[[], Awaitable[None]]]], tasks: list[TaskData],
                  concurrency: int, total: int, group: int = 1) -> Result:
    call, close = make()
    try:
        warm_until = time.perf_counter() + WARM_UP_S  # long enough for an elastic pool to finish growing
        while time.perf_counter() < warm_until:
            await drive(call, tasks, concurrency, max(50, 2 * concurrency), group)
        return await drive(call, tasks, concurrency, total, group)
    finally:
        await close()


def in_process(endpoint: Endpoint, turns: int) -> Callable[[], tuple[Call, Callable[[], Awaitable[None]]]]:
    def make() -> tuple[Call, Callable[[], Awaitable[None]]]:
        taskset, model = Echo({"turns": turns}), ChatClient(endpoint)

        async def call(data: TaskData, indices: list[int]) -> list[Trace]:
            if len(indices) == 1:
                return [await run_rollout(taskset, data, model, rollout_index=indices[0], sampling=SAMPLING)]
            return list(await asyncio.gather(*(run_rollout(taskset, data, model, rollout_index=i, sampling=SAMPLING)
                                              for i in indices)))

        return call, model.aclose

    return make


def through(address: str, endpoint: Endpoint,
            episodes: bool = False) -> Callable[[], tuple[Call, Callable[[], Awaitable[None]]]]:
    """Rollouts through the server at `address`: as traces (`run`), or with `episodes` as the solo episodes eval and
    the orchestrator ask for (`run_episodes`: each trace inside its one-member episode record)."""
    def make() -> tuple[Call, Callable[[], Awaitable[None]]]:
        client = EnvClient(address)

        async def call(data: TaskData, indices: list[int]) -> list[Trace]:
            if episodes:
                played = await client.run_episodes(data, endpoint, SAMPLING, episode_indices=indices)
                return [e.traces[SOLO] for e in played]
            return await client.run(data, endpoint, SAMPLING, rollout_indices=indices)

        return call, client.aclose

    return make


class RssSampler:
    """Peak summed RSS (MiB) of a process and its children, sampled in a thread."""

    def __init__(self, address: str) -> None:
        self.pid = asyncio.run(_health(address))["pid"]
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            pids = [self.pid, *_children(self.pid)]
            self.peak = max(self.peak, sum(_rss_mib(p) for p in pids))

    @contextlib.contextmanager
    def sampling(self) -> Iterator[RssSampler]:
        self.peak = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


async def _health(address: str) -> dict:
    async with EnvClient(address) as client:
        return await client.health()


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    return []


def _rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def row(turns: int, group: int, path: str, concurrency: int, result: Result, base: Result | None,
        rss: float | None) -> str:
    ratio = f"{result.rate / base.rate:5.2f}x" if base else "     -"
    added = f"{result.p50_ms - base.p50_ms:+7.2f}" if base else "      -"
    memory = f"{rss:7.0f}" if rss is not None else "      -"
    return (f"| {turns} | {group} | {path:<19} | {concurrency:>4} | {result.rate:8.0f} | {ratio} | "
            f"{result.p50_ms:7.2f} | {added} | {result.p99_ms:8.2f} | {memory} | {result.errors} |")


def main() -> None:
    import env_server_curve  # it imports this module's pieces

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000,
                        help="single-turn rollouts per measurement (5-turn: a fifth; concurrency 1: a quarter)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the static pool")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4],
                        help="rollouts of one task per call (per request through the server), as `tracegym eval -r`")
    parser.add_argument("--episodes", action="store_true",
                        help="ask the server for solo episodes, as eval and the orchestrator do, instead of traces")
    parser.add_argument("--curve", action="store_true",
                        help="the published curve instead: see benchmarks/env_server_curve.py and its flags below")
    env_server_curve.add_arguments(parser)
    args = parser.parse_args()
    if args.curve:
        env_server_curve.run(args)
        return
    print("| turns | per call | path | conc. | rollouts/s | vs in-process | p50 ms | p50 added ms | p99 ms "
          "| peak RSS MiB (server+workers) | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with fake_endpoint() as base_url:
        endpoint = Endpoint(base_url=base_url, model="fake-model", api_key_env=None, max_retries=0)
        tasks = list(Echo({"num_tasks": 100}))
        for turns in args.turns:
            run_turns(endpoint, tasks, turns, args)


def run_turns(endpoint: Endpoint, tasks: list[TaskData], turns: int, args: argparse.Namespace) -> None:
    """Every concurrency for one number of turns: in process, then through a static and an elastic server."""
    total = args.rollouts // turns
    options = {"turns": turns}
    with local_server(SPEC, options, workers=args.workers) as static, \
            local_server(SPEC, options, elastic=True) as elastic:
        servers = {f"server static {args.workers}w": static, "server elastic": elastic}
        samplers = {name: RssSampler(address) for name, address in servers.items()}
        for group in args.groups:
            for c in (c for c in args.concurrency if c >= group):
                n = total if c > 1 else max(200, total // 4)
                base = asyncio.run(measure(in_process(endpoint, turns), tasks, c, n, group))
                print(row(turns, group, "in-process", c, base, None, None), flush=True)
                for name, address in servers.items():
                    with samplers[name].sampling() as sampler:
                        result = asyncio.run(measure(through(address, endpoint, args.episodes), tasks, c, n, group))
                    print(row(turns, group, name, c, result, base, sampler.peak), flush=True)

if __name__ == "__main__":
    main()
