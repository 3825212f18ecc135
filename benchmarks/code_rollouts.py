"""Benchmark: 64 concurrent sandboxed rollouts of python-functions: rollouts/s, peak memory, and leaks, per runtime.

Every rollout opens its own sandbox (setup), gets a right answer at once from a scripted model (a lookup
solution, so every kind of function is exercised), runs it against the hidden tests in the sandbox, is scored
and closes its sandbox (cleanup); `--concurrency` rollouts are in flight at once, in this process. Peak memory
is the largest sum of the resident memory of this process and all its descendants (wrappers, inits, the
programs), sampled every 50 ms. Leaks, counted after the last rollout: processes still carrying the marker of
one of our sandboxes, our sandboxes' working directories left in the temp folder, and file descriptors this
process holds beyond those it held before. Each runtime's rate is also given as a ratio to the first runtime's.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/code_rollouts.py [--rollouts 256] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import tracegym as tg
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.process_sandbox import sandbox_processes
from tracegym.runtimes.processes import descendants
from tracegym.tasksets.python_functions import FunctionData, PythonFunctions
from tracegym.testing import ScriptedModel

PAGE = resource.getpagesize()


@dataclass
class Outcome:
    rate: float
    peak_mb: float
    rewards: float
    errors: int
    leaked_processes: int
    leaked_workdirs: int
    leaked_fds: int


def oracle(rows: list[FunctionData]) -> str:
    """A right answer for every row with this prompt (prompts may repeat; their hidden tests differ)."""
    table = {json.dumps(t.args): t.expected for row in rows for t in row.tests}
    return (f"```python\nimport json\ndef {rows[0].function}(*args):\n"
            f"    return {table!r}[json.dumps(list(args))]\n```")


def tree_rss_mb() -> float:
    """Resident memory of this process and all its descendants, in MB."""
    family = {os.getpid(), *descendants(os.getpid())}
    total = 0
    for pid in family:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**20


class PeakSampler:
    """The highest `tree_rss_mb` seen, sampled on a thread until stopped."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.peak, self.every_s, self._stop = 0.0, every_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb())
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def workdirs() -> set[str]:
    """This process's sandbox working directories (other processes on the machine may have theirs)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"tracegym-sandbox-{os.getpid()}-*")}


async def bench(runtime: str, rollouts: int, concurrency: int) -> Outcome:
    taskset = PythonFunctions({"runtime": runtime, "num_tasks": rollouts})
    rows: dict[str, list[FunctionData]] = {}
    for row in taskset:
        rows.setdefault(str(row.prompt), []).append(row)
    model = ScriptedModel(rule=lambda request: oracle(rows[request.messages[-1].text]))
    fds, dirs = len(os.listdir("/proc/self/fd")), workdirs()
    with PeakSampler() as sampler:
        start = time.perf_counter()
        traces = await tg.evaluate(taskset, model, num_tasks=rollouts, rollouts=1, concurrency=concurrency)
        elapsed = time.perf_counter() - start
    await asyncio.sleep(0.5)  # let the last SIGKILLs land before counting survivors
    return Outcome(rate=len(traces) / elapsed, peak_mb=sampler.peak,
                   rewards=sum(t.reward or 0.0 for t in traces) / len(traces),
                   errors=sum(bool(t.errors) for t in traces),
                   leaked_processes=len(sandbox_processes(f"{os.getpid()}-")),
                   leaked_workdirs=len(workdirs() - dirs), leaked_fds=len(os.listdir("/proc/self/fd")) - fds)


async def main(rollouts: int, concurrency: int) -> None:
    print(f"{rollouts} rollouts, {concurrency} at once, {os.cpu_count()} cores; idle process tree "
          f"{tree_rss_mb():.0f} MB")
    print(f"{'runtime':12} {'rollouts/s':>10} {'x first':>8} {'peak MB':>8} {'mean reward':>11} {'errors':>6} "
          f"{'leaked: procs':>13} {'workdirs':>8} {'fds':>4}")
    first = None
    for name in ("subprocess", "bubblewrap", "container"):
        reason = runtime_for(name).unavailable()
        if reason:
            print(f"{name:12} unavailable: {reason}")
            continue
        await bench(name, min(16, rollouts), concurrency)  # warm-up: imports, probes, caches
        out = await bench(name, rollouts, concurrency)
        first = first or out.rate
        print(f"{name:12} {out.rate:10.1f} {out.rate / first:8.2f} {out.peak_mb:8.0f} {out.rewards:11.3f} "
              f"{out.errors:6d} {out.leaked_processes:13d} {out.leaked_workdirs:8d} {out.leaked_fds:4d}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.concurrency))
