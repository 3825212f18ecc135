"""Benchmark: what one frame costs our OpenEnv server and its worker process with one caller (issue 33).

One caller (openenv's own client, keeping its WebSocket) plays single-turn echo rollouts (two frames each: reset,
step) against `tracegym serve --protocol openenv` for `--seconds`; printed: the rate, and the CPU per frame of the
server's process and of its worker, each on its own. `--strace` also counts each process's system calls per frame
(strace slows them: its rate and CPU mean nothing then); `--py-spy DIR` records both (raw stacks, 200 Hz) into DIR.

    flock /work/heavy.lock .venv/bin/python benchmarks/openenv_frame_cost.py [--workers 1] [--seconds 10] [--strace]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import psutil
from openenv.core.generic_client import GenericEnvClient
from openenv_server import ours, port_of

FRAMES = 2
"""Frames per single-turn rollout: reset, step."""


async def play(url: str, seconds: float) -> int:
    """Rollouts played by one caller in `seconds`."""
    done, until = 0, time.perf_counter() + seconds
    async with GenericEnvClient(base_url=url) as env:
        while time.perf_counter() < until:
            result = await env.reset(index=done % 100)
            while not result.done:
                said = result.observation["messages"][-1]["content"]
                result = await env.step({"message": said.removeprefix("Say ").removesuffix(".")})
            done += 1
    return done


def processes_of(url: str) -> list[psutil.Process]:
    """The server's process and its workers."""
    port = port_of(url)
    [pid] = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    server = psutil.Process(pid)
    return [server, *server.children(recursive=True)]


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def watched(procs: list[psutil.Process], args: argparse.Namespace) -> Iterator[list[Path]]:
    """strace or py-spy on each process for the block; the files they write."""
    out = Path(args.py_spy or "/tmp")
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"{'strace' if args.strace else 'py-spy'}-{n}-{p.pid}.txt" for n, p in enumerate(procs)]
    pairs = list(zip(procs, files, strict=True))
    spy = str(Path(sys.executable).parent / "py-spy")
    if args.strace:
        tools = [subprocess.Popen(["strace", "-c", "-f", "-p", str(p.pid), "-o", str(f)]) for p, f in pairs]
    elif args.py_spy:
        tools = [subprocess.Popen([spy, "record", "-p", str(p.pid), "-d", str(int(args.seconds) + 2), "-r", "200",
                                   "-f", "raw", "-o", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for p, f in pairs]
    else:
        tools = []
    time.sleep(1.0 if tools else 0.0)  # (the tools attach: nothing to wait on)
    try:
        yield files if tools else []
    finally:
        for tool in tools:
            if args.strace:
                tool.terminate()
            tool.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="the server's worker processes (0: in its own)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--strace", action="store_true", help="count system calls per frame (slows everything)")
    parser.add_argument("--py-spy", metavar="DIR", help="record each process with py-spy into DIR")
    args = parser.parse_args()
    with ours(1, args.workers) as url:
        asyncio.run(play(url, 2.0))  # warm: the worker is up, the code paths taken once
        procs = processes_of(url)
        with watched(procs, args) as files:
            before = [cpu_s(p) for p in procs]
            start = time.perf_counter()
            done = asyncio.run(play(url, args.seconds))
            elapsed = time.perf_counter() - start
            after = [cpu_s(p) for p in procs]
        frames = done * FRAMES
        print(f"{done / elapsed:.0f} rollouts/s, one caller, {args.workers} worker(s)")
        for n, (proc, a, b) in enumerate(zip(procs, before, after, strict=True)):
            name = "server" if n == 0 else f"worker {n}"
            print(f"{name} (pid {proc.pid}): {(b - a) * 1e6 / frames:.0f} us CPU/frame")
        for path, proc in zip(files, procs, strict=True) if files else ():
            if args.strace:
                print(f"--- pid {proc.pid}: system calls per frame")
                for line in path.read_text().splitlines()[2:]:
                    cols = line.split()
                    if len(cols) >= 5 and cols[3].isdigit() and cols[-1] != "total":
                        print(f"  {cols[-1]:<16} {int(cols[3]) / frames:6.2f}")
            else:
                print(f"py-spy: {path}")


if __name__ == "__main__":
    main()
