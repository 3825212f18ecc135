"""Benchmark: CPU ms per rollout through the env server, by process (the caller, the server, its workers).

A static 2-worker echo server against the instant fake endpoint: 1,000 warm-up rollouts at c=128, then `n`
single-turn rollouts at c=128; CPU is user + system time of every thread, from `/proc/PID/stat`. Less sensitive to
other jobs on the machine than rollouts/s, so a change to the server path shows here first.

    flock /work/heavy.lock .venv/bin/python benchmarks/env_server_cpu.py [n]
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from env_server import _children, _health, drive, through
from fake_endpoint import fake_endpoint

from tracegym import Endpoint
from tracegym.serve import local_server
from tracegym.testing.echo import SPEC, Echo

CONCURRENCY = 128


def cpu_s(pid: int) -> float:
    """User + system seconds of a process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(address: str, endpoint: Endpoint, n: int) -> tuple[list[float], float]:
    """(CPU ms per rollout of the caller, the server, its workers; rollouts/s)."""
    tasks = list(Echo({"num_tasks": 100}))
    server = (await _health(address))["pid"]
    call, close = through(address, endpoint)()
    try:
        await drive(call, tasks, CONCURRENCY, 1000)
        workers = _children(server)
        before = [cpu_s(os.getpid()), cpu_s(server), sum(cpu_s(p) for p in workers)]
        result = await drive(call, tasks, CONCURRENCY, n)
        after = [cpu_s(os.getpid()), cpu_s(server), sum(cpu_s(p) for p in workers)]
    finally:
        await close()
    return [(a - b) / n * 1e3 for a, b in zip(after, before, strict=True)], result.rate


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    with fake_endpoint() as base_url:
        endpoint = Endpoint(base_url=base_url, model="fake-model", api_key_env=None, max_retries=0)
        with local_server(SPEC, {"turns": 1}, workers=2) as address:
            ms, rate = asyncio.run(measure(address, endpoint, n))
    print(f"cpu ms/rollout caller {ms[0]:.3f} server {ms[1]:.3f} workers {ms[2]:.3f} total {sum(ms):.3f}; "
          f"{rate:.0f}/s")


if __name__ == "__main__":
    main()
