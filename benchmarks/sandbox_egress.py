"""Benchmark: what an egress allow-list costs a sandbox: start to the program's first instruction, and connections
through it (connect + one echo round trip, and bulk throughput), beside the same without one.

Start: as `benchmarks/sandbox_start.py` (`date +%s.%N` through `Sandbox.run`, minus the clock before the call),
per namespace runtime, under four network setups: none (the baseline), the proxy's forward alone, an allow-list of
one address (the init adds it to its loopback and listens), and one address plus a hostname (a hosts file over
/etc/hosts too). Connections: a program connects to a TCP echo server on the host's 127.0.0.1 `--connections`
times, one echo each, and prints its own p50/p99; then sends `--megabytes` through one connection and back. It
runs unsandboxed (the baseline), in a sandbox with `network=True` (no relay), and in one whose allow-list names
the server (the init's threads and the host relay carry each connection). Init: the program init's own network
set-up, timed inside it (in a fresh `unshare --net --mount` each sample, as root): the proxy's forward alone (what
every agent program pays today), one allowed address more (netlink), a hosts file bound over /etc/hosts (ctypes'
C module and mount(2)), and a child entering a user namespace of its own (bubblewrap's program); this is the part
a loaded host blurs least.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/sandbox_egress.py [--samples 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tracegym.runtimes.bubblewrap import Bubblewrap
from tracegym.runtimes.limited_process import LimitedProcess, detect_isolation
from tracegym.runtimes.process_sandbox import INIT_SOURCE
from tracegym.runtimes.sandbox import Forward, Limits, Sandbox

DATE = ["date", "+%s.%N"]
CLIENT = """
import json, socket, sys, time
port, count, megabytes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(count):
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"x")
        conn.recv(1)
    times.append(time.perf_counter() - start)
times.sort()
block, total = b"y" * 65536, megabytes << 20
start = time.perf_counter()
with socket.create_connection(("127.0.0.1", port)) as conn:
    sent = received = 0
    conn.setblocking(True)
    while received < total:
        if sent < total:
            sent += conn.send(block)
        received += len(conn.recv(1 << 20))
print(json.dumps({"p50_ms": times[len(times) // 2] * 1e3, "p99_ms": times[int(len(times) * 0.99)] * 1e3,
                  "mb_s": 2 * megabytes / (time.perf_counter() - start)}))
"""
"""Connect-and-echo latency (p50, p99) and bulk throughput (both directions) to 127.0.0.1:PORT."""


SETUP_TIMER = """
import os, sys, time
namespace = {"__name__": "program_init"}
exec(compile(sys.argv[1], "program_init", "exec"), namespace)
wall, cpu = time.perf_counter(), time.process_time()
counts, userns = namespace["set_up_network"](sys.argv[2].split("\\n"))
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
child = time.perf_counter()
pid = os.fork()
if pid == 0:
    if userns is not None:
        namespace["enter_user_namespace"](*userns)
    os._exit(0)
os.waitpid(pid, 0)
print(wall * 1e6, cpu * 1e6, (time.perf_counter() - child) * 1e6)
"""
"""Defines the program init's functions, then times `set_up_network` (wall and CPU) and its child's start (a fork,
entering its user namespace where told), in microseconds."""


def init_setup_us(samples: int) -> dict[str, tuple[float, float, float]]:
    """Median microseconds of the init's network set-up (wall, CPU) and of its child's start, per set-up (see the
    module)."""
    folder = Path(tempfile.mkdtemp(prefix="tracegym-bench-init-"))
    hosts = folder / "hosts"
    hosts.write_text("10.213.250.1 far.test\n127.0.0.1 localhost\n")
    forward = f"forward 127.0.0.1 8999 {folder}/proxy.sock"
    egress = f"egress 10.213.250.1 443 {folder}/0.sock"
    setups = {"nothing (reference)": [], "proxy forward (today)": [forward], "+ 1 allowed address": [forward, egress],
              "+ hosts file": [forward, egress, f"hosts {hosts}"],
              "+ program's user namespace": [forward, egress, "userns 1234567 1234567"]}
    times: dict[str, list[list[float]]] = {name: [] for name in setups}
    for _ in range(samples):
        for name, lines in setups.items():
            spec = "\n".join(lines)
            done = subprocess.run(["unshare", "--net", "--mount", "--fork", "python3", "-I", "-S", "-c", SETUP_TIMER,
                                   INIT_SOURCE, spec], capture_output=True, text=True, check=True)
            times[name].append([float(v) for v in done.stdout.split()])
    shutil.rmtree(folder)
    return {name: (statistics.median(t[0] for t in taken), statistics.median(t[1] for t in taken),
                   statistics.median(t[2] for t in taken)) for name, taken in times.items()}


async def echo_server() -> tuple[asyncio.AbstractServer, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 20):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def start_ms(box: Sandbox, limits: Limits, forward: Forward | None) -> float:
    """Milliseconds from `run` to the program's first instruction."""
    before = time.time()
    result = await box.run(DATE, limits=limits, forward=forward)
    assert result.ok, result
    return (float(result.stdout) - before) * 1e3


async def start_figures(box: Sandbox, setups: dict[str, tuple[Limits, Forward | None]],
                        samples: int) -> dict[str, tuple[float, float]]:
    """p50 and p99 start milliseconds of each setup, sampled in turn (a loaded host slows them all alike), after
    five warm-up rounds."""
    times: dict[str, list[float]] = {name: [] for name in setups}
    for i in range(samples + 5):
        for name, (limits, forward) in setups.items():
            took = await start_ms(box, limits, forward)
            if i >= 5:
                times[name].append(took)
    return {name: (statistics.median(t), sorted(t)[int(len(t) * 0.99)]) for name, t in times.items()}


async def connections(box: Sandbox | None, limits: Limits, port: int, count: int, megabytes: int) -> dict[str, float]:
    argv = [sys.executable if box is None else "python3", "-c", CLIENT, str(port), str(count), str(megabytes)]
    if box is None:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return dict(json.loads(out))
    result = await box.run(argv, limits=limits)
    assert result.ok, result
    return dict(json.loads(result.stdout))


async def main(samples: int, count: int, megabytes: int, parts: set[str]) -> None:
    base = Limits(wall_seconds=120, cpu_seconds=120, memory_mb=1024, output_bytes=100_000)
    server, port = await echo_server()
    proxy = Path(tempfile.mkdtemp(prefix="tracegym-bench-proxy-"))
    proxy.chmod(0o711)
    forward = Forward(8999, proxy / "proxy.sock")
    unix = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(forward.socket))
    setups = {
        "none": (base, None),
        "proxy forward": (base, forward),
        "allow 1 address": (base.model_copy(update={"egress": ("10.213.250.1:7",)}), None),
        "allow address + hostname": (base.model_copy(update={"egress": ("10.213.250.1:7", "localhost:7")}), None),
    }
    runtimes = {f"subprocess ({detect_isolation()})": LimitedProcess(base), "bubblewrap": Bubblewrap(base)}
    if "start" in parts:
        print(f"start to first instruction, ms p50 / p99 ({samples} samples each, in turn), p50 added to none")
    for name, runtime in runtimes.items():
        if "start" not in parts:
            break
        if runtime.unavailable():
            print(f"  {name}: unavailable: {runtime.unavailable()}")
            continue
        box = await runtime.open()
        figures = await start_figures(box, setups, samples)
        await box.close()
        for setup, (p50, p99) in figures.items():
            print(f"  {name:28} {setup:26} {p50:6.1f} / {p99:6.1f}   {p50 - figures['none'][0]:+5.1f}")
    if "connections" in parts:
        print(f"\nconnections to the host's 127.0.0.1 echo server: connect + 1 echo ms p50 / p99 ({count}), "
              f"and {megabytes} MB each way")
        direct = await connections(None, base, port, count, megabytes)
        print(f"  {'unsandboxed':48} {direct['p50_ms']:6.3f} / {direct['p99_ms']:6.3f}   {direct['mb_s']:7.0f} MB/s")
    for name, runtime in runtimes.items():
        if runtime.unavailable() or "connections" not in parts:
            continue
        for label, limits in (("network=True", base.model_copy(update={"network": True})),
                              ("egress allow-list", base.model_copy(update={"egress": (f"127.0.0.1:{port}",)}))):
            box = await runtime.open()
            got = await connections(box, limits, port, count, megabytes)
            await box.close()
            print(f"  {name + ', ' + label:48} {got['p50_ms']:6.3f} / {got['p99_ms']:6.3f}   {got['mb_s']:7.0f} MB/s")
    server.close()
    unix.close()
    shutil.rmtree(proxy)
    if "init" in parts and os.geteuid() == 0 and shutil.which("unshare"):
        print(f"\nthe init's network set-up, timed inside it, us p50 ({samples} samples each): wall, CPU; then "
              "its child's start (fork, and the user namespace where asked)")
        for name, (wall, cpu, child) in init_setup_us(samples).items():
            print(f"  {name:32} {wall:8.0f} {cpu:8.0f}   {child:8.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--parts", default="start,connections,init", help="which of start,connections,init")
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.connections, args.megabytes, set(args.parts.split(","))))
