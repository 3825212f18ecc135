"""Benchmark: what the sandbox view costs at start, paired sample by sample against the former whole-host view.

For bubblewrap and the subprocess runtime's namespace modes, two sandboxes run `date +%s.%N` in turn: one builds
the sandbox view (`runtimes.sandbox_view`), the other the former view (bwrap: `--ro-bind / /` with a tmpfs over
/tmp, /var/tmp, /dev/shm and home; subprocess: the host's filesystem with its own /proc, no `-X tracegym-view`).
Alternating the two, sample by sample, keeps a loaded machine's drift out of the difference. Each figure is the
time from the call to the program's first instruction (its clock reading), p50 and p99 in ms, after 5 warm-ups.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/sandbox_view.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from tracegym.runtimes.bubblewrap import Bubblewrap, BwrapConfinement
from tracegym.runtimes.limited_process import NamespaceConfinement, _no_new_privs, detect_isolation, unshare_flags
from tracegym.runtimes.process_sandbox import Launch, ProcessSandbox
from tracegym.runtimes.sandbox import Limits

PROGRAM = ["date", "+%s.%N"]


class FormerBwrap(BwrapConfinement):
    """bwrap as it was: the host's root read-only, a tmpfs of `disk_mb` over each scratch folder and home."""

    def wrap(self, launch: Launch) -> list[str]:
        flags = ["bwrap", "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
                 "--dev", "/dev", "--proc", "/proc"]
        for folder in ("/tmp", "/var/tmp", "/dev/shm", str(Path.home())):
            flags += ["--size", str(launch.limits.disk_mb << 20), "--tmpfs", folder]
        workdir = str(launch.workdir)
        return [*flags, "--bind", workdir, workdir, "--chdir", workdir, "--", *launch.init]


class FormerNamespaces(NamespaceConfinement):
    """`unshare` as it was: the host's filesystem with the sandbox's own /proc."""

    private_tmp = False

    def wrap(self, launch: Launch) -> list[str]:
        return [*unshare_flags(self.as_root, launch.limits.network), "--", *_no_new_privs(), *launch.init]


async def first_instruction_ms(sandbox: ProcessSandbox) -> float:
    before = time.time()
    result = await sandbox.run(PROGRAM)
    assert result.ok, result
    return (float(result.stdout) - before) * 1e3


async def paired(label: str, former: ProcessSandbox, view: ProcessSandbox, samples: int) -> None:
    times: dict[str, list[float]] = {"former": [], "view": []}
    try:
        for index in range(samples + 5):
            for name, sandbox in (("former", former), ("view", view))[:: 1 if index % 2 else -1]:
                taken = await first_instruction_ms(sandbox)
                if index >= 5:
                    times[name].append(taken)
    finally:
        await former.close()
        await view.close()
    figures = {name: (statistics.median(t), sorted(t)[min(len(t) - 1, int(len(t) * 0.99))]) for name, t in
               times.items()}
    print(f"{label:36} {figures['former'][0]:10.1f} {figures['former'][1]:10.1f} {figures['view'][0]:10.1f} "
          f"{figures['view'][1]:10.1f} {figures['view'][0] - figures['former'][0]:+10.1f}")


async def main(samples: int) -> None:
    limits = Limits()
    print(f"{'runtime':36} {'former p50':>10} {'former p99':>10} {'view p50':>10} {'view p99':>10} {'p50 diff':>10}")
    reason = Bubblewrap().unavailable()
    if reason:
        print(f"{'bubblewrap':36} unavailable: {reason}")
    else:
        await paired("bubblewrap", ProcessSandbox(FormerBwrap(), limits), ProcessSandbox(BwrapConfinement(), limits),
                     samples)
    isolation = detect_isolation()
    if isolation == "process-group":
        print(f"{'subprocess':36} no namespaces on this host: no view to measure")
        return
    as_root = isolation == "namespaces"
    await paired(f"subprocess ({isolation})", ProcessSandbox(FormerNamespaces(as_root), limits),
                 ProcessSandbox(NamespaceConfinement(as_root), limits), samples)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    asyncio.run(main(parser.parse_args().samples))
