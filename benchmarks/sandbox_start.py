"""Benchmark: sandbox start to the program's first instruction, p50/p99, per runtime, beside a plain subprocess.

Each sample runs `date +%s.%N` (a program whose first work is to read the clock) through `Sandbox.run` and
subtracts the wall-clock time just before the call from the time it printed: the cost of the runtime's wrapper,
namespaces, program init and limits before the program runs. The baseline is the same program started by
`asyncio.create_subprocess_exec` with no sandbox. `open` is the separate cost of `Runtime.open` (a working
directory, the uid). Runtimes this host lacks are listed with the reason.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/sandbox_start.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from tracegym.runtimes.catalog import RUNTIMES, runtime_for
from tracegym.runtimes.limited_process import LimitedProcess, detect_isolation
from tracegym.runtimes.sandbox import Runtime, Sandbox

PROGRAM = ["date", "+%s.%N"]


async def plain_start() -> float:
    """Seconds from the call to the first instruction of an unsandboxed subprocess."""
    before = time.time()
    proc = await asyncio.create_subprocess_exec(*PROGRAM, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return float(out) - before


def sandboxed_start(sandbox: Sandbox) -> Callable[[], Awaitable[float]]:
    async def sample() -> float:
        before = time.time()
        result = await sandbox.run(PROGRAM)
        assert result.ok, result
        return float(result.stdout) - before

    return sample


async def open_cost(runtime: Runtime, samples: int) -> float:
    """Median seconds of `open` + `close` of an empty sandbox."""
    costs = []
    for _ in range(samples):
        start = time.perf_counter()
        sandbox = await runtime.open()
        costs.append(time.perf_counter() - start)
        await sandbox.close()
    return statistics.median(costs)


async def measure(sample: Callable[[], Awaitable[float]], samples: int) -> tuple[float, float]:
    """p50 and p99 in milliseconds, after five warm-up samples."""
    for _ in range(5):
        await sample()
    times = sorted([await sample() for _ in range(samples)])
    return statistics.median(times) * 1e3, times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3


def candidates() -> list[tuple[str, Runtime]]:
    found: list[tuple[str, Runtime]] = [(f"subprocess ({detect_isolation()})", runtime_for("subprocess"))]
    if detect_isolation() != "process-group":
        found.append(("subprocess (process-group fallback)", LimitedProcess(isolation="process-group")))
    return found + [(name, runtime_for(name)) for name in RUNTIMES if name != "subprocess"]


async def main(samples: int) -> None:
    base50, base99 = await measure(plain_start, samples)
    print(f"{'runtime':38} {'p50 ms':>8} {'p99 ms':>8} {'x plain p50':>12} {'open+close ms':>14}")
    print(f"{'plain subprocess (no sandbox)':38} {base50:8.1f} {base99:8.1f} {1.0:12.1f} {'-':>14}")
    for label, runtime in candidates():
        reason = runtime.unavailable()
        if reason:
            print(f"{label:38} unavailable: {reason}")
            continue
        sandbox = await runtime.open()
        try:
            p50, p99 = await measure(sandboxed_start(sandbox), samples)
        finally:
            await sandbox.close()
        opened = await open_cost(runtime, 20) * 1e3
        print(f"{label:38} {p50:8.1f} {p99:8.1f} {p50 / base50:12.1f} {opened:14.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    asyncio.run(main(parser.parse_args().samples))
