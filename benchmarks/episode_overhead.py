"""Benchmark: the cost of an episode over single-agent rollouts with the same number of model calls.

A two-seat, ten-turn episode (`Duet`: members a and b alternate for 5 rounds, each seeing the other's public
output) against a ten-turn single-agent rollout (`Solo`: the task answers every turn), both against a model that
answers at once: in process (a scripted model) and through an env server (the fake OpenAI server in its own
process). The same number of episodes and rollouts run at the same concurrency; the ratio episode time /
rollout time is the overhead (target <= 1.2x); each is measured `--repeat` times, alternating, and the median
ratio is reported (a shared machine's noise moves single runs by tens of percent).

    .venv/bin/python benchmarks/episode_overhead.py [--count 400] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

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


async def timed(run: Awaitable[object]) -> float:
    start = time.perf_counter()
    await run
    return time.perf_counter() - start


async def in_process(count: int, concurrency: int) -> tuple[float, float]:
    model = ScriptedModel(rule=lambda r: "<think>hm</think>Fine.", tokens=True)
    solo = await timed(tg.evaluate(Solo(), model, num_tasks=count, concurrency=concurrency))
    duet = await timed(evaluate_episodes(Duet(), model, num_tasks=count, concurrency=concurrency))
    return solo, duet


async def served(count: int, concurrency: int) -> tuple[float, float]:
    sys.path.insert(0, str(SPEC_FILE.parent))
    from fake_endpoint import fake_endpoint

    from tracegym.serve import EnvClient, local_server

    times = []
    with fake_endpoint() as base_url:
        endpoint = tg.Endpoint(base_url=base_url, model="fake-model", api_key_env=None)
        for name, taskset in (("Solo", Solo()), ("Duet", Duet())):
            with local_server(f"{SPEC_FILE}:{name}", workers=1) as address:
                async with EnvClient(address) as client:
                    run = client.evaluate_episodes if name == "Duet" else client.evaluate
                    await run(taskset, endpoint, num_tasks=min(count, 20), concurrency=concurrency)  # warm up
                    times.append(await timed(run(taskset, endpoint, num_tasks=count, concurrency=concurrency)))
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=400, help="episodes (and rollouts) per measurement")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.count} ten-call rollouts vs {args.count} two-seat ten-turn episodes, concurrency {args.concurrency}")
    for where, measure in (("in process", in_process), ("env server", served)):
        asyncio.run(measure(min(args.count, 50), args.concurrency))  # warm up imports and caches
        runs = [asyncio.run(measure(args.count, args.concurrency)) for _ in range(args.repeat)]
        solo, duet = (statistics.median(r[i] for r in runs) for i in (0, 1))
        ratio = statistics.median(d / s for s, d in runs)
        print(f"{where:>10}: rollouts {solo:.2f}s ({args.count / solo:.0f}/s), episodes {duet:.2f}s "
              f"({args.count / duet:.0f}/s), median ratio {ratio:.2f}x of {args.repeat} (target <= 1.2x)")


if __name__ == "__main__":
    main()
