"""Benchmark: the cost of an episode over single-agent rollouts with the same number of model calls.

A two-seat, ten-turn episode (`Duet`: members a and b alternate for 5 rounds, each seeing the other's public
output) against a ten-turn single-agent rollout (`Solo`: the task answers every turn), both against a model that
answers at once: in process (a scripted model) and through an env server (the fake OpenAI server in its own
process). The same number of episodes and rollouts run at the same concurrency; the ratio episode time /
rollout time is the overhead (target <= 1.1x); each is measured `--repeat` times, alternating which side goes
first, and the median ratio is reported (a shared machine's noise moves single runs by tens of percent). Each
side starts from the same heap: its own fresh scripted model (which keeps every request it answered) and a
garbage collection just before it, so neither pays for the other's leftovers in the collector's passes. In
process, the CPU time this process spent is measured too (the work is all in it, and on a machine shared with
other jobs the CPU-time ratio moves far less than the wall-clock one; an env server spreads the work over
processes, so there only wall time is meaningful), and the same without garbage collection: about a quarter of the
CPU time is the collector's, in lumps (at `--count 400` one full collection of 60-80 ms lands in each side, its
cost set by the heap at that moment), which moves a run's ratio by several percent either way.

    .venv/bin/python benchmarks/episode_overhead.py [--count 400] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import NamedTuple

import tracegym as tg
from tracegym.envs.evaluate import evaluate_episodes
from tracegym.envs.multi_agent import MultiAgentTask
from tracegym.envs.schedule import Member
from tracegym.testing import ScriptedModel

SPEC_FILE = Path(__file__).resolve()


class SoloTask(tg.Task):
    """Ten model turns: the task answers each one."""

    max_turns = 10

    async def env_response(self, trace: tg.Trace) -> str:
        return "Go on."


class DuetTask(MultiAgentTask):
    """Two members, five rounds: ten model turns in all."""

    seats = (Member(id="a", system_prompt="You are a."), Member(id="b", system_prompt="You are b."))
    rounds = 5


class Solo(tg.Taskset):
    id = "solo"
    task_class = SoloTask

    def load(self) -> Iterator[dict]:
        return ({"prompt": f"Talk ({i}).", "id": str(i)} for i in itertools.count())

    infinite = True


class Duet(Solo):
    id = "duet"
    task_class = DuetTask


class Took(NamedTuple):
    """Seconds one side took: on the wall clock, of this process's CPU, and of that in garbage collection."""

    wall: float
    cpu: float
    gc: float


class _Collections:
    """CPU seconds the collector spent while counting (its start and stop callbacks)."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start


async def timed(run: Awaitable[object]) -> Took:
    gc.collect()
    collections = _Collections()
    gc.callbacks.append(collections)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        await run
    finally:
        gc.callbacks.remove(collections)
    return Took(time.perf_counter() - start, time.process_time() - cpu, collections.seconds)


async def in_process(count: int, concurrency: int, duet_first: bool = False) -> tuple[Took, Took]:
    def model() -> ScriptedModel:
        return ScriptedModel(rule=lambda r: "<think>hm</think>Fine.", tokens=True)

    async def solo() -> Took:
        return await timed(tg.evaluate(Solo(), model(), num_tasks=count, concurrency=concurrency))

    async def duet() -> Took:
        return await timed(evaluate_episodes(Duet(), model(), num_tasks=count, concurrency=concurrency))

    if duet_first:
        episodes = await duet()
        return await solo(), episodes
    return await solo(), await duet()


async def served(count: int, concurrency: int, duet_first: bool = False) -> tuple[Took, Took]:
    sys.path.insert(0, str(SPEC_FILE.parent))
    from fake_endpoint import fake_endpoint

    from tracegym.serve import EnvClient, local_server

    times = {}
    sides = [("Solo", Solo()), ("Duet", Duet())]
    with fake_endpoint() as base_url:
        endpoint = tg.Endpoint(base_url=base_url, model="fake-model", api_key_env=None)
        for name, taskset in reversed(sides) if duet_first else sides:
            with local_server(f"{SPEC_FILE}:{name}", workers=1) as address:
                async with EnvClient(address) as client:
                    run = client.evaluate_episodes if name == "Duet" else client.evaluate
                    await run(taskset, endpoint, num_tasks=min(count, 20), concurrency=concurrency)  # warm up
                    times[name] = await timed(run(taskset, endpoint, num_tasks=count, concurrency=concurrency))
    return times["Solo"], times["Duet"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=400, help="episodes (and rollouts) per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.count} ten-call rollouts vs {args.count} two-seat ten-turn episodes, concurrency {args.concurrency}, "
          f"load average {os.getloadavg()[0]:.1f}")
    for where, measure in (("in process", in_process), ("env server", served)):
        asyncio.run(measure(min(args.count, 50), args.concurrency))  # warm up imports and caches
        runs = [asyncio.run(measure(args.count, args.concurrency, duet_first=i % 2 == 1)) for i in range(args.repeat)]
        solo, duet = (statistics.median(r[i].wall for r in runs) for i in (0, 1))
        ratio = statistics.median(d.wall / s.wall for s, d in runs)
        cpu_ratio = statistics.median(d.cpu / s.cpu for s, d in runs)
        no_gc = statistics.median((d.cpu - d.gc) / (s.cpu - s.gc) for s, d in runs)
        cpu = f", CPU-time ratio {cpu_ratio:.2f}x ({no_gc:.2f}x without collection)" if where == "in process" else ""
        print(f"{where:>10}: rollouts {solo:.2f}s ({args.count / solo:.0f}/s), episodes {duet:.2f}s "
              f"({args.count / duet:.0f}/s), median ratio {ratio:.2f}x{cpu} of {args.repeat} (target <= 1.1x)")


if __name__ == "__main__":
    main()
