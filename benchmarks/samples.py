"""Benchmark: building a trace's graph, its size on disk and the time to turn it into training samples, 1 to 1000 turns.

Each trace is built the way the token client builds one: every turn's prompt extends the branch (a 60-token
environment message) and samples a 100-token completion with logprobs. Build is the time spent in the graph
(`add` + `add_model_turn`, the prompts themselves made outside the clock; best of several builds). Size is the
JSON line a run folder writes and the msgpack frame the env server sends; samples is `trace_samples` (best of
several runs). All must grow linearly with turns (per-turn columns flat); target (issue 6): >= 2 million
tokens/s of sample building. (Checking that a prompt extends the branch still reads the prompt once, in one
C-level list comparison, ~1 ns per token here, where the prompt shares the branch's int objects as the token
client's bridge does.)

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/samples.py [--turns 1 10 100 1000]
"""

from __future__ import annotations

import argparse
import random
import time

import msgpack

from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.train.samples import trace_samples

PROMPT_TOKENS, COMPLETION_TOKENS = 60, 100


def build_trace(turns: int, seed: int = 0) -> tuple[Trace, float]:
    """A single-branch trace of `turns` model turns with exact tokens and logprobs, and the seconds its graph
    calls took."""
    rng = random.Random(seed)
    trace = Trace(task=TaskData(prompt="benchmark"), policy_version=1)
    prefix: list[int] = []
    seconds = 0.0
    for turn in range(turns):
        prompt = prefix + [rng.randrange(50_000) for _ in range(PROMPT_TOKENS)]
        completion = [rng.randrange(50_000) for _ in range(COMPLETION_TOKENS)]
        logprobs = [-rng.random() * 5 for _ in range(COMPLETION_TOKENS)]
        start = time.perf_counter()
        trace.graph.add(user(f"environment message {turn}"))
        trace.graph.add_model_turn(assistant(f"reply {turn}"), prompt, completion, logprobs, temperature=1.0)
        seconds += time.perf_counter() - start
        prefix = prompt + completion
    return trace, seconds


def best_build(turns: int, repeats: int) -> tuple[Trace, float]:
    builds = [build_trace(turns) for _ in range(repeats)]
    return builds[0][0], min(seconds for _, seconds in builds)


def best_time(trace: Trace, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        trace_samples(trace)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 100, 1000])
    args = parser.parse_args()
    header = (f"{'turns':>6} {'tokens':>9} {'build ms':>9} {'us/turn':>8} {'json KiB':>10} {'B/turn':>8} "
              f"{'msgpack KiB':>12} {'samples ms':>11} {'us/turn':>8} {'Mtok/s':>7}")
    print(header)
    rates = []
    for turns in args.turns:
        trace, build = best_build(turns, repeats=max(1, min(5, 200 // turns)))
        tokens = len(trace.graph.tokens())
        json_bytes = len(trace.model_dump_json())
        msgpack_bytes = len(msgpack.packb(trace.model_dump(mode="json")))
        seconds = best_time(trace, repeats=max(3, 2000 // turns))
        rates.append(tokens / seconds)
        print(f"{turns:>6} {tokens:>9} {build * 1e3:>9.2f} {build / turns * 1e6:>8.1f} {json_bytes / 1024:>10.1f} "
              f"{json_bytes / turns:>8.0f} {msgpack_bytes / 1024:>12.1f} {seconds * 1e3:>11.3f} "
              f"{seconds / turns * 1e6:>8.1f} {tokens / seconds / 1e6:>7.1f}")
    verdict = "met" if min(rates[1:] or rates) >= 2e6 else "NOT met"
    print(f"target >= 2.0 M tokens/s of sample building: {verdict} (slowest {min(rates) / 1e6:.1f} M tokens/s)")


if __name__ == "__main__":
    main()
