"""Benchmark: sandbox start to the program's first instruction, p50/p99, per runtime, beside a plain subprocess;
open from a warm pool against a cold open; and a burst of queued starts with and without admission control.

Each sample runs `date +%s.%N` (a program whose first work is to read the clock) through `Sandbox.run` and
subtracts the wall-clock time just before the call from the time it printed: the cost of the runtime's wrapper,
namespaces, program init and limits before the program runs. The baseline is the same program started by
`asyncio.create_subprocess_exec` with no sandbox. `open` is the separate cost of `Runtime.open` (a working
directory, the uid), cold and taken from a warm pool through `runtimes.admission` (p50/p99 of each).

The burst (`--queued N`, 0 to skip): N starts requested at once, each an open, a first run of the same program and a
close, under `Limits(memory_mb=--memory-mb)`: once straight through `Runtime.open` (admission `off`), then through
an `Admission` with this host's defaults, or each `--starting` cap and `--overcommit` (column `admission`: the cap,
and `xN` for a memory overcommit). Per row: aborts (an open that raised or a run that did not run
the program), p50/p99/max seconds from the request to the program's first instruction, the whole burst's wall time,
the most sandboxes open at once, and the host's peak memory use above its use before the burst (MemTotal -
MemAvailable, read every 10 ms). Runtimes this host lacks are listed with the reason.

`--against SRC` compares this source's starts with those of another
tracegym source (its `src` folder: an older commit's worktree, say), side by side on a loaded host: a worker
process imports it and keeps a sandbox of each runtime open, and every round takes one plain start, one start here
and one there, in turn; per runtime, p50/p99 of each and their ratio to the plain starts of the same rounds.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/sandbox_start.py [--samples 200] [--queued 512]
    .venv/bin/python benchmarks/sandbox_start.py --samples 0 --queued 0 --against ../old/src [--rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tracegym.runtimes.admission import Admission, AdmissionConfig, host_memory
from tracegym.runtimes.catalog import RUNTIMES, runtime_for
from tracegym.runtimes.limited_process import FALLBACK, detect_isolation
from tracegym.runtimes.sandbox import Limits, Runtime, Sandbox

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


async def pooled_open_cost(runtime: Runtime, samples: int) -> list[float]:
    """Seconds of each `Admission.open` taken from a full warm pool (closed after)."""
    admission = Admission(AdmissionConfig(warm_pool=4, jitter_s=0))
    await (await admission.open(runtime)).close()  # the first open is cold and starts the pool
    pool = admission.pool(runtime)
    assert pool is not None
    costs = []
    try:
        for _ in range(samples):
            await pool.full()
            start = time.perf_counter()
            sandbox = await admission.open(runtime)
            costs.append(time.perf_counter() - start)
            await sandbox.close()
    finally:
        await admission.close()
    return costs


async def cold_open_cost(runtime: Runtime, samples: int) -> list[float]:
    """Seconds of each `Runtime.open` (closed after)."""
    costs = []
    for _ in range(samples):
        start = time.perf_counter()
        sandbox = await runtime.open()
        costs.append(time.perf_counter() - start)
        await sandbox.close()
    return costs


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 of `values`."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def candidates(limits: Limits | None = None) -> list[tuple[str, Runtime]]:
    found: list[tuple[str, Runtime]] = [(f"subprocess ({detect_isolation()})", runtime_for("subprocess", limits)),
                                        (f"{FALLBACK} (fallback, by name)", runtime_for(FALLBACK, limits))]
    return found + [(name, runtime_for(name, limits)) for name in RUNTIMES if name not in ("subprocess", FALLBACK)]


async def start_table(samples: int) -> None:
    base50, base99 = await measure(plain_start, samples)
    print(f"{'runtime':38} {'p50 ms':>8} {'p99 ms':>8} {'x plain':>8} {'open+close':>11} "
          f"{'cold open p50/p99 ms':>21} {'pool open p50/p99 ms':>21}")
    print(f"{'plain subprocess (no sandbox)':38} {base50:8.1f} {base99:8.1f} {1.0:8.1f}")
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
        cold50, cold99 = percentiles(await cold_open_cost(runtime, 100))
        pool50, pool99 = percentiles(await pooled_open_cost(runtime, 100))
        print(f"{label:38} {p50:8.1f} {p99:8.1f} {p50 / base50:8.1f} {opened:11.2f} "
              f"{cold50 * 1e3:10.2f}/{cold99 * 1e3:<10.2f} {pool50 * 1e3:10.3f}/{pool99 * 1e3:<10.3f}")


def serve(runtime_name: str) -> None:
    """`--serve`: open a sandbox of `runtime_name` and answer each line on stdin with one start's seconds (the
    other side of `--against`)."""
    loop = asyncio.new_event_loop()
    sandbox = loop.run_until_complete(runtime_for(runtime_name).open())
    sample = sandboxed_start(sandbox)
    try:
        for _ in sys.stdin:
            print(loop.run_until_complete(sample()), flush=True)
    finally:
        loop.run_until_complete(sandbox.close())


async def against_table(source: str, rounds: int, runtimes: list[str] | None) -> None:
    """Starts of this source and of the tracegym source at `source`, round by round beside plain starts."""
    print(f"{rounds} rounds (a plain start, one here, one in {source}, in turn) per runtime; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'runtime':24} {'plain p50/p99':>14} {'here p50/p99':>14} {'x plain':>7} {'there p50/p99':>14} "
          f"{'x plain':>7} {'here/there':>10}")
    names = [name for name in ("subprocess", FALLBACK, "bubblewrap")
             if not runtimes or any(name.startswith(wanted) for wanted in runtimes)]
    for name in names:
        runtime = runtime_for(name)
        if reason := runtime.unavailable():
            print(f"{name:24} unavailable: {reason}")
            continue
        worker = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", name, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": source})
        assert worker.stdin is not None and worker.stdout is not None
        sandbox = await runtime.open()
        here = sandboxed_start(sandbox)
        times: dict[str, list[float]] = {"plain": [], "here": [], "there": []}
        try:
            for index in range(rounds + 5):  # five warm-up rounds
                worker.stdin.write(b"\n")
                sampled = {"plain": await plain_start(), "here": await here(),
                           "there": float(await worker.stdout.readline())}
                for key, value in sampled.items():
                    if index >= 5:
                        times[key].append(value * 1e3)
        finally:
            await sandbox.close()
            worker.stdin.close()
            await worker.wait()
        (plain50, plain99), (here50, here99), (there50, there99) = (percentiles(times[key]) for key in times)
        print(f"{name:24} {plain50:6.1f}/{plain99:<7.1f} {here50:6.1f}/{here99:<7.1f} {here50 / plain50:7.1f} "
              f"{there50:6.1f}/{there99:<7.1f} {there50 / plain50:7.1f} {here50 / there50:10.2f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


class MemoryPeak:
    """The host's peak memory use (MemTotal - MemAvailable) above its use at the start, read every 10 ms by a
    thread (the event loop is busy in a burst)."""

    def __init__(self) -> None:
        host = host_memory()
        self.base = self.peak = host.total_mb - host.available_mb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            host = host_memory()
            self.peak = max(self.peak, host.total_mb - host.available_mb)

    def stop(self) -> int:
        """MB above the start at the peak."""
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


@dataclass
class Burst:
    """What a burst of starts saw (seconds): each start's wait for its open, its run's start to the first
instruction, and the whole from the burst's request."""

    waits: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    wholes: list[float] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    open_now: int = 0
    most_open: int = 0


async def burst(open_one: Callable[[], Awaitable[Sandbox]], queued: int) -> tuple[Burst, float, int]:
    """`queued` starts at once (open, one run, close) through `open_one`; what they saw, the wall seconds and the
    peak memory above the start (MB)."""
    seen, memory = Burst(), MemoryPeak()
    requested = time.time()

    async def start() -> None:
        try:
            sandbox = await open_one()
        except Exception as exc:
            seen.aborts.append(f"open: {type(exc).__name__}: {exc}")
            return
        seen.waits.append(time.time() - requested)
        seen.open_now += 1
        seen.most_open = max(seen.most_open, seen.open_now)
        try:
            called = time.time()
            result = await sandbox.run(PROGRAM)
            if result.ok:
                seen.starts.append(float(result.stdout) - called)
                seen.wholes.append(float(result.stdout) - requested)
            else:
                seen.aborts.append(f"run: {result.start_error or result.limit or result.exit_code} "
                                   f"{result.stderr[-200:]}")
        finally:
            seen.open_now -= 1
            await sandbox.close()

    began = time.perf_counter()
    await asyncio.gather(*(start() for _ in range(queued)))
    return seen, time.perf_counter() - began, memory.stop()


async def burst_table(queued: int, memory_mb: int, caps: list[int], overcommits: list[float],
                      runtimes: list[str] | None) -> None:
    config = AdmissionConfig()
    print(f"\n{queued} starts requested at once (open + first run + close), Limits(memory_mb={memory_mb}); "
          f"admission: host defaults ({config.max_starting} starting at once, jitter {config.jitter_s:g} s, budget "
          f"{config.setup_budget_s:g} s, reserve {config.memory_reserve_mb} MB of {host_memory().total_mb} MB)")
    print(f"{'runtime':38} {'admission':>11} {'aborts':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'wall s':>7} "
          f"{'most open':>9} {'peak MB':>8}")
    for label, runtime in candidates(Limits(memory_mb=memory_mb)):
        if runtimes and not any(label.startswith(name) for name in runtimes):
            continue
        reason = runtime.unavailable()
        if reason:
            print(f"{label:38} unavailable: {reason}")
            continue
        settings = [(cap, over) for cap in caps or [config.max_starting] for over in overcommits or [1.0]]
        for cap, over in [(0, 1.0), *settings]:
            if cap:  # 0: without admission, every start at once
                admission = Admission(config.model_copy(update={"max_starting": cap, "memory_overcommit": over}))
            seen, wall, peak = await burst(functools.partial(admission.open, runtime) if cap else runtime.open,
                                           queued)
            p50, p99 = percentiles(seen.wholes) if seen.wholes else (float("nan"), float("nan"))
            worst = max(seen.wholes, default=float("nan"))
            mode = (f"{cap}" + (f" x{over:g}" if over != 1 else "")) if cap else "off"
            print(f"{label:38} {mode:>11} {len(seen.aborts):6} {p50:7.2f} {p99:7.2f} "
                  f"{worst:7.2f} {wall:7.2f} {seen.most_open:9} {peak:8}")
            for why in sorted(set(seen.aborts))[:3]:
                print(f"    abort: {why}")


async def main(args: argparse.Namespace) -> None:
    if args.against:
        await against_table(args.against, args.rounds, args.runtime)
    if args.samples:
        await start_table(args.samples)
    if args.queued:
        await burst_table(args.queued, args.memory_mb, args.starting, args.overcommit, args.runtime)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="starts per runtime for p50/p99 (0: skip)")
    parser.add_argument("--queued", type=int, default=512, help="starts requested at once in the burst (0: skip)")
    parser.add_argument("--memory-mb", type=int, default=512, help="Limits.memory_mb of the burst's sandboxes")
    parser.add_argument("--starting", type=int, action="append", default=[],
                        help="a start cap to burst under (repeatable; default: the host's)")
    parser.add_argument("--overcommit", type=float, action="append", default=[],
                        help="a memory_overcommit to burst under (repeatable; default 1)")
    parser.add_argument("--runtime", action="append",
                        help="burst (and compare, --against) only runtimes whose label starts with this")
    parser.add_argument("--against", metavar="SRC", help="compare starts with the tracegym source at SRC (its src/)")
    parser.add_argument("--rounds", type=int, default=300, help="rounds of the --against comparison")
    parser.add_argument("--serve", metavar="RUNTIME", help=argparse.SUPPRESS)  # --against's worker
    parsed = parser.parse_args()
    if parsed.serve:
        serve(parsed.serve)
    else:
        asyncio.run(main(parsed))
