"""Benchmark: fan-out + RAE over 10,000 two-seat episodes (issue 15's target: under one second).

Builds 10,000 finished two-seat episodes of a zero-sum game (outside the clock), spread over 64 tasks, and times
what the orchestrator does with them before any sample is built: fan each episode out into one training unit per
trainable member (`episode_units`), then compute RAE advantages per (taskset, task, member) key
(`advantaged`), in groups of 8 episodes as a step hands them over. For scale, the same units under group mean
are timed side by side, and seat metrics over all of them. Best of `--repeat` runs each.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/fan_out_rae.py [--episodes 10000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from tracegym.core.episode import Episode
from tracegym.core.task_data import TaskData
from tracegym.testing import make_episode
from tracegym.train.advantages import AdvantageConfig, build_advantages
from tracegym.train.fan_out import advantaged, episode_units
from tracegym.train.seat_metrics import seat_metrics

GROUP = 8
TARGET_S = 1.0


def episodes(n: int, seed: int = 0) -> list[list[Episode]]:
    """`n` episodes in groups of `GROUP` (one task each), the winner drawn at random."""
    rng = random.Random(seed)
    tasks = [TaskData(prompt=f"deal {i}") for i in range(64)]
    out = []
    for start in range(0, n, GROUP):
        task = rng.choice(tasks)
        group = []
        for _ in range(min(GROUP, n - start)):
            r = rng.choice((1.0, -1.0))
            group.append(make_episode({"player_0": r, "player_1": -r}, task=task, taskset="kuhn-poker"))
        out.append(group)
    return out


def fan_out_and_advantages(groups: list[list[Episode]], advantage: AdvantageConfig) -> Callable[[], int]:
    def run() -> int:
        advantages = build_advantages(advantage)  # fresh baselines: every run starts cold
        trained = 0
        for group in groups:
            units, _ = episode_units(group)
            trained += len(advantaged(units, advantages))
        return trained

    return run


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    groups = episodes(args.episodes)
    flat = [e for g in groups for e in g]
    rae_s, units = best(fan_out_and_advantages(groups, AdvantageConfig(name="rae")), args.repeat)
    mean_s, _ = best(fan_out_and_advantages(groups, AdvantageConfig(name="group_mean", filter_no_signal=False)),
                     args.repeat)
    all_units, _ = episode_units(flat)
    pairs = advantaged(all_units, build_advantages(AdvantageConfig(name="rae")))
    metrics_s, _ = best(lambda: seat_metrics(flat, pairs), args.repeat)
    print(f"{args.episodes} episodes -> {units} training units, best of {args.repeat}")
    print(f"fan-out + RAE         {rae_s:.3f} s  ({rae_s / args.episodes * 1e6:.1f} us/episode)  "
          f"target < {TARGET_S:.0f} s: {'met' if rae_s < TARGET_S else 'MISSED'} ({rae_s / TARGET_S:.2f}x of it)")
    print(f"fan-out + group mean  {mean_s:.3f} s  (RAE / group mean = {rae_s / mean_s:.2f}x)")
    print(f"seat metrics          {metrics_s:.3f} s")


if __name__ == "__main__":
    main()
