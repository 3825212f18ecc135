"""Benchmark: what the sandbox's cgroup costs: start to the program's first instruction, p50/p99, per runtime,
with and without the cgroup, beside a plain subprocess (`sandbox_start.py` measures starts, warm pools and bursts).

Each sample runs `date +%s.%N` (a program whose first work is to read the clock) through `Sandbox.run` and
subtracts the wall-clock time just before the call from the time it printed: the cost of the runtime's wrapper,
namespaces, program init and limits before the program runs. The baseline is the same program started by
`asyncio.create_subprocess_exec` with no sandbox. `open` is the separate cost of `Runtime.open` (a working
directory, the uid, the cgroup). Each runtime is measured with the sandbox's cgroup (`runtimes.cgroup`, where this
host lets us make one) and without (cgroups turned off for this process), in alternating blocks, so the columns
compare under the same load; and what entering a cgroup costs a fresh process, writing itself to v1's `tasks` (what
the program init does) against `cgroup.procs`, one entry every 50 ms as runs come. Runtimes this host lacks are
listed with the reason.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/sandbox_cgroup_cost.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import time
from collections.abc import Iterator

from sandbox_start import candidates, measure, open_cost, percentiles, plain_start, sandboxed_start

from tracegym.runtimes import cgroup
from tracegym.runtimes.sandbox import Runtime


@contextlib.contextmanager
def cgroups(on: bool) -> Iterator[None]:
    """Sandboxes opened inside get a cgroup (where the host allows) or, with `on` False, none."""
    real = cgroup.placement
    if not on:
        cgroup.placement = lambda: "turned off by the benchmark"  # type: ignore[assignment]
    try:
        yield
    finally:
        cgroup.placement = real  # type: ignore[assignment]


async def compare(runtime: Runtime, samples: int, blocks: int = 4) -> dict[bool, tuple[float, float, float]]:
    """p50 and p99 to the first instruction and the median open+close, with and without the cgroup, measured in
    `blocks` alternating blocks of `samples / blocks` runs each."""
    times: dict[bool, list[float]] = {True: [], False: []}
    opens: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(blocks):
        for on in (True, False):
            with cgroups(on):
                sandbox = await runtime.open()
                try:
                    sample = sandboxed_start(sandbox)
                    for _ in range(3):
                        await sample()
                    times[on] += [await sample() for _ in range(max(1, samples // blocks))]
                finally:
                    await sandbox.close()
                opens[on].append(await open_cost(runtime, 5))
    return {on: (*milliseconds(percentiles(times[on])), statistics.median(opens[on]) * 1e3) for on in (True, False)}


def entry_cost(entry: str, samples: int) -> tuple[float, float]:
    """p50 and p99 ms of a fresh child writing `0` to `entry` in a sandbox cgroup of each hierarchy, spaced 50 ms."""
    where = cgroup.placement()
    assert not isinstance(where, str)
    made = cgroup.SandboxCgroup.make(where, f"{os.getpid()}-benchmark", 256, 16)
    fds = [os.open(folder / entry, os.O_WRONLY) for folder in made.folders]
    times = []
    try:
        for _ in range(samples):
            took_r, took_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                start = time.perf_counter()
                for fd in fds:
                    os.write(fd, b"0")
                os.write(took_w, str(time.perf_counter() - start).encode())
                os._exit(0)
            os.close(took_w)
            times.append(float(os.read(took_r, 64)))
            os.close(took_r)
            os.waitpid(pid, 0)
            time.sleep(0.05)
    finally:
        for fd in fds:
            os.close(fd)
        made.remove()
    return milliseconds(percentiles(times))


def milliseconds(seconds: tuple[float, float]) -> tuple[float, float]:
    return seconds[0] * 1e3, seconds[1] * 1e3


async def main(samples: int) -> None:
    logging.basicConfig(level=logging.ERROR)  # the warnings that cgroups are off, once per runtime, are expected
    where = cgroup.placement()
    print(f"cgroups: {where if isinstance(where, str) else f'v{where.version} under {where.memory}, {where.pids}'}")
    if not isinstance(where, str) and where.version == 1:
        for entry in ("tasks", "cgroup.procs"):
            p50, p99 = entry_cost(entry, 40)
            print(f"entering by {entry:12}: p50 {p50:6.2f} ms, p99 {p99:6.2f} ms")
    base50, base99 = await measure(plain_start, samples)
    print(f"{'runtime':34} {'cgroup':>6} {'p50 ms':>8} {'p99 ms':>8} {'x plain p50':>12} {'open+close ms':>14}")
    print(f"{'plain subprocess (no sandbox)':34} {'-':>6} {base50:8.1f} {base99:8.1f} {1.0:12.1f} {'-':>14}")
    for label, runtime in candidates():
        reason = runtime.unavailable()
        if reason:
            print(f"{label:34} unavailable: {reason}")
            continue
        for on, (p50, p99, opened) in (await compare(runtime, samples)).items():
            print(f"{label:34} {'yes' if on else 'no':>6} {p50:8.1f} {p99:8.1f} {p50 / base50:12.1f} {opened:14.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    asyncio.run(main(parser.parse_args().samples))
