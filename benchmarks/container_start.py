"""Benchmark: the container runtime's start to the program's first instruction, side by side per command line, and
a burst of queued container starts through admission control.

Starts (`--samples N` per variant, 0 to skip): one sandbox per variant, each sample a run of `date +%s.%N` (its
first work is to read the clock) minus the wall-clock time just before `Sandbox.run`; the variants are sampled in
turn (one of each, again and again), so a load that comes and goes (other jobs share the cores) weighs on all
alike. Variants: a plain subprocess (no sandbox: the load reference); `run, tmpfs each` (the command line before:
`ENGINE run` with /tmp, /var/tmp, /dev/shm each a tmpfs of disk_mb); `run, one cap` (`ENGINE run`, those folders
bound from the sandbox's one tmpfs); `start, created ahead` (what a sandbox's runs get from its second on: `ENGINE
start` of a container created and initialized ahead; the sample waits, untimed, until the next one is ready, so
its making does not weigh on the other variants' samples: a run that comes sooner waits for the rest of it).
p50/p99/min in ms, after three warm-up samples.

Burst (`--queued N`, 0 to skip): N sandboxes requested at once, each an open, one run of the same program and a
close, through an `Admission` with this host's defaults (or each `--starting` cap) but for its setup budget
(`--budget-s`: the last of a long queue waits for all before it, and the default budget would abort it). Per burst:
aborts (an open that raised, a run that did not run the program), p50/p99/max of the queue wait (request to the
open's return: memory, jitter, start slot, open), of the start (the run's call to the program's first instruction)
and of the whole (request to first instruction), the wall time, the most sandboxes open at once, the memory
ceiling (how many sandboxes of `--memory-mb` the host's MemAvailable less the reserve admits at once) and the
host's peak memory use above its use before the burst. `--no-admission` adds the same burst straight through
`Runtime.open` (careful: N engine clients at once on a shared host).

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/container_start.py [--samples 100] [--queued 512]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import statistics
from collections.abc import Awaitable, Callable

from sandbox_start import burst, plain_start, sandboxed_start

from tracegym.runtimes.admission import Admission, AdmissionConfig, host_memory
from tracegym.runtimes.container import Container, ContainerConfinement, detect_engine
from tracegym.runtimes.process_sandbox import Launch, ProcessSandbox
from tracegym.runtimes.sandbox import Limits, Sandbox


class TmpfsEach(ContainerConfinement):
    """The command line before one disk cap: /tmp, /var/tmp and /dev/shm each a tmpfs of disk_mb, always `run`."""

    def _flags(self, launch: Launch) -> list[str]:
        flags, size = super()._flags(launch), launch.limits.disk_mb
        binds = {i for i, flag in enumerate(flags) if flag == "-v" and ":nosuid,nodev" in flags[i + 1]}
        binds |= {i for i, flag in enumerate(flags) if flag == "--ipc"}
        kept = [flag for i, flag in enumerate(flags) if i not in binds and i - 1 not in binds]
        return [*kept, "--tmpfs", f"/tmp:size={size}m", "--tmpfs", f"/var/tmp:size={size}m", "--shm-size", f"{size}m"]


def prepared_start(box: ProcessSandbox) -> Callable[[], Awaitable[float]]:
    """A sample of `box`'s start, then the wait (not timed) until the next run's container is prepared: its
    creation does not overlap the other variants' samples."""
    sample = sandboxed_start(box)

    async def timed() -> float:
        took = await sample()
        prepared = getattr(box.confinement, "_prepared", None)
        if prepared is not None:
            await asyncio.to_thread(prepared.creating.wait)
        return took

    return timed


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and the least of `values`."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], ordered[0]


async def start_table(samples: int) -> None:
    engine, why = detect_engine()
    if engine is None or Container().unavailable():
        print(f"container: unavailable: {why or Container().unavailable()}")
        return
    limits = Container().limits
    boxes = {"run, tmpfs each (before)": ProcessSandbox(TmpfsEach(engine, Container().image, ahead=False), limits),
             "run, one cap": ProcessSandbox(ContainerConfinement(engine, Container().image, ahead=False), limits),
             "start, created ahead": ProcessSandbox(ContainerConfinement(engine, Container().image), limits)}
    variants: dict[str, Callable[[], Awaitable[float]]] = {"plain subprocess (no sandbox)": plain_start}
    variants.update({label: sandboxed_start(box) for label, box in boxes.items()})
    variants["start, created ahead"] = prepared_start(boxes["start, created ahead"])
    times: dict[str, list[float]] = {label: [] for label in variants}
    try:
        for round_ in range(samples + 3):
            for label, sample in variants.items():
                took = await sample()
                if round_ >= 3:
                    times[label].append(took * 1e3)
    finally:
        for box in boxes.values():
            await box.close()
    print(f"{'start to first instruction':32} {'p50 ms':>8} {'p99 ms':>8} {'min ms':>8}   ({samples} each, in turn)")
    for label, values in times.items():
        p50, p99, least = percentiles(values)
        print(f"{label:32} {p50:8.1f} {p99:8.1f} {least:8.1f}")


def spread(values: list[float]) -> str:
    """`p50/p99/max` seconds of `values`."""
    if not values:
        return f"{'-':>17}"
    ordered = sorted(values)
    p50, p99 = statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{p50:5.2f}/{p99:5.2f}/{ordered[-1]:5.2f}"


async def burst_table(queued: int, memory_mb: int, budget_s: float, caps: list[int], without: bool) -> None:
    runtime = Container(Limits(memory_mb=memory_mb))
    reason = runtime.unavailable()
    if reason:
        print(f"container: unavailable: {reason}")
        return
    config = AdmissionConfig(setup_budget_s=budget_s)
    host = host_memory()
    ceiling = math.floor((host.available_mb - config.memory_reserve_mb) / memory_mb)
    print(f"\n{queued} container starts requested at once (open + one run + close), Limits(memory_mb={memory_mb}); "
          f"admission: {config.starting} starting at once (host default), jitter {config.jitter_s:g} s, setup budget "
          f"{config.setup_budget_s:g} s, reserve {config.memory_reserve_mb} MB; memory ceiling {ceiling} sandboxes "
          f"open at once ({host.available_mb} MB available of {host.total_mb} MB)")
    print(f"{'admission':11} {'aborts':>6} {'queue wait p50/p99/max s':>25} {'start p50/p99/max s':>20} "
          f"{'whole p50/p99/max s':>20} {'wall s':>7} {'most open':>9} {'peak MB':>8}")
    modes: list[tuple[str, Callable[[], Awaitable[Sandbox]]]] = [
        (f"{cap} at once", functools.partial(Admission(config.model_copy(update={"starting": cap})).open, runtime))
        for cap in caps or [config.starting]]
    modes += [("off", runtime.open)] if without else []
    for mode, open_one in modes:
        seen, wall, peak = await burst(open_one, queued)
        print(f"{mode:11} {len(seen.aborts):6} {spread(seen.waits):>25} {spread(seen.starts):>20} "
              f"{spread(seen.wholes):>20} {wall:7.1f} {seen.most_open:9} {peak:8}")
        for why in sorted(set(seen.aborts))[:3]:
            print(f"    abort: {why}")


async def main(args: argparse.Namespace) -> None:
    if args.samples:
        await start_table(args.samples)
    if args.queued:
        await burst_table(args.queued, args.memory_mb, args.budget_s, args.starting, args.no_admission)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="starts per variant for p50/p99 (0: skip)")
    parser.add_argument("--queued", type=int, default=512, help="container starts requested at once (0: skip)")
    parser.add_argument("--memory-mb", type=int, default=512, help="Limits.memory_mb of the burst's sandboxes")
    parser.add_argument("--budget-s", type=float, default=900.0, help="the burst's admission setup budget")
    parser.add_argument("--starting", type=int, action="append", default=[],
                        help="an admission cap on starts at once to burst under (repeatable; default: the host's)")
    parser.add_argument("--no-admission", action="store_true", help="also burst without admission control")
    asyncio.run(main(parser.parse_args()))
