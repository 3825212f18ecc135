"""Benchmark: what the rollout filters cost beside the sample building every trace already goes through, and (given
an RL run folder) what they catch in its real traces at their defaults and at other thresholds.

Cost: single-turn traces of 48 to 4096 sampled tokens (random ids, logprobs like a temperature-1 sampler's, no
loop: the worst case for the repetition search, which stops at the first loop it finds) are screened by both
filters and turned into samples (`checked_samples`, as the orchestrator does), best of several runs, side by side.

Catches (`--run-dir outputs/rl/<run-id>`): every trace of the run's steps that training looked at (each episode's
trainable members', a rollout's own; `RLFolder.step_log`, which reads old run folders too), the share
each filter catches, the mean reward of those it catches against the others (a filter worth enforcing catches
worse rollouts), and the first few caught replies.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/filters.py [--run-dir outputs/rl/<run-id>]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.train.fan_out import unfit
from tracegym.train.filters import Filters, Gibberish, Repetition, RolloutFilter, screen
from tracegym.train.rl_folder import RLFolder
from tracegym.train.samples import checked_samples
from tracegym.train.signal import learner_traces

LENGTHS = [48, 512, 4096]
RULES: list[RolloutFilter] = [
    Gibberish(), Gibberish(run=2), Gibberish(logprob_below=-10.0), Gibberish(logprob_below=-15.0),
    Repetition(), Repetition(min_tokens=8), Repetition(min_tokens=16), Repetition(min_tokens=32),
]
"""The defaults first, then other thresholds."""


def random_trace(completion: int, seed: int = 0) -> Trace:
    rng = random.Random(seed)
    trace = Trace(task=TaskData(prompt="benchmark"), stop_reason=StopReason.COMPLETED)
    trace.graph.add(user("benchmark"))
    trace.prompt_length = 1
    trace.graph.add_model_turn(assistant("reply"), [rng.randrange(50_000) for _ in range(60)],
                               [rng.randrange(50_000) for _ in range(completion)],
                               [-rng.expovariate(0.5) for _ in range(completion)], temperature=1.0)
    trace.rewards["reward"] = RewardScore(score=1.0)
    return trace


def best_seconds(work, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def cost() -> None:
    filters = Filters().active()
    print(f"{'tokens':>7} {'filters us':>11} {'samples us':>11} {'filters/samples':>16}")
    for length in LENGTHS:
        trace = random_trace(length)
        repeats = max(5, 20_000 // length)
        filtering = best_seconds(lambda t=trace: screen(filters, [("bench", t)]), repeats)
        sampling = best_seconds(lambda t=trace: checked_samples(t), repeats)
        print(f"{length:>7} {filtering * 1e6:>11.1f} {sampling * 1e6:>11.1f} {filtering / sampling:>16.2f}")


def read_traces(run_dir: Path) -> list[Trace]:
    folder = RLFolder(run_dir)
    episodes = [e for step in folder.steps() for e in folder.step_log(step).read().episodes]
    return [t for t in learner_traces(episodes) if unfit(t) is None]  # what the filters are run on


def catches(run_dir: Path, examples: int = 3) -> None:
    traces = read_traces(run_dir)
    mean = statistics.fmean(t.reward for t in traces)
    print(f"\n{len(traces)} trainable traces in {run_dir}; mean reward {mean:.3f}")
    print(f"{'filter':<58} {'caught':>7} {'rate':>7} {'reward caught':>14} {'reward rest':>12}")
    for rule in RULES:
        caught = [t for t in traces if rule.catches(t)]
        rest = [t.reward for t in traces if t not in caught]
        shown = f"{rule.name} {rule.model_dump(exclude={'mode'})}"
        mean = f"{statistics.fmean(t.reward for t in caught):.3f}" if caught else "-"
        print(f"{shown:<58} {len(caught):>7} {len(caught) / len(traces):>7.2%} {mean:>14} "
              f"{statistics.fmean(rest):>12.3f}")
        for trace in caught[:examples] if rule in (RULES[0], RULES[4]) else []:
            print(f"    {trace.last_reply[:100]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="an RL run folder whose traces to screen")
    args = parser.parse_args()
    cost()
    if args.run_dir:
        catches(args.run_dir)


if __name__ == "__main__":
    main()
