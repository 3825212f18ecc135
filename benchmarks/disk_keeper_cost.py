"""Benchmark: what the disk keeper costs an unprivileged user's sandbox (`runtimes.workdir`): making and removing
a sandbox folder with its keeper (a user and mount namespace holding one tmpfs of disk_mb) against a plain,
uncapped folder, and starting a program inside the keeper's namespaces (`nsenter` in front of the wrapper) against
starting it directly; p50/p90, in alternating samples so both columns see the same load.

Run as root it measures the same code an unprivileged user runs (the keeper needs no privilege: `unshare --user`),
told it is not root; the programs are `true`, so the figures are the keeper's own cost.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/disk_keeper_cost.py [--samples 50]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from unittest import mock

from tracegym.runtimes.workdir import enter_disk, make_workdir, remove_workdir


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"p50 {statistics.median(ordered):6.1f} ms   p90 {ordered[int(len(ordered) * 0.9)]:6.1f} ms"


def folder_cost(kept: bool) -> tuple[float, float]:
    """Milliseconds to make a sandbox folder (with a keeper where `kept`) and to remove it."""
    made: list[os.PathLike[str]] = []
    make = timed(lambda: made.append(make_workdir(f"{os.getpid()}-bench", None, 64, namespaced=kept)[0].parent))
    return make, timed(lambda: remove_workdir(made[0]))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    samples = parser.parse_args().samples
    logging.disable(logging.WARNING)  # the plain folders' "not capped" warning: they are the baseline
    costs: dict[str, list[float]] = {name: [] for name in ("make kept", "remove kept", "make plain", "remove plain",
                                                          "run in keeper", "run direct")}
    with mock.patch("os.geteuid", return_value=1000):
        workdir, capped = make_workdir(f"{os.getpid()}-bench-run", None, 64, namespaced=True)
        assert capped, "no keeper here (unprivileged user namespaces?)"
        try:
            for _ in range(samples):
                for kept, label in ((True, "kept"), (False, "plain")):
                    make, remove = folder_cost(kept)
                    costs[f"make {label}"].append(make)
                    costs[f"remove {label}"].append(remove)
                costs["run in keeper"].append(timed(lambda: subprocess.run([*enter_disk(workdir.parent), "true"],
                                                                           check=True)))
                costs["run direct"].append(timed(lambda: subprocess.run(["true"], check=True)))
        finally:
            remove_workdir(workdir.parent)
    print(f"disk keeper cost, {samples} samples each, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, values in costs.items():
        print(f"  {name:14} {summary(values)}")


if __name__ == "__main__":
    main()
