"""`tracegym serve` as a process: prints its address, logs per worker, and stops with nothing left behind."""

import asyncio
import os
import signal
import subprocess
import sys

from serve_helpers import alive, task, wait_for

from tracegym.runtimes.processes import stop
from tracegym.serve import EnvClient, local_server
from tracegym.serve.local_server import _read_address
from tracegym.testing.echo import SPEC


async def test_local_server_serves_and_leaves_no_process(tmp_path, endpoint):
    with local_server(SPEC, {"num_tasks": 3}, workers=2, log_dir=tmp_path) as address:
        async with EnvClient(address) as client:
            assert await client.run(task("hi"), endpoint)
            while not (health := await client.health())["spares"]:  # two workers, then the spare behind them
                await asyncio.sleep(0.05)
            pids = health["pids"]
    assert len(pids) == 3 and not [p for p in pids if alive(p)]
    assert {p.name for p in tmp_path.iterdir()} == {"server.log", "worker-w1.log", "worker-w2.log", "worker-w3.log"}
    assert not [p for p in tmp_path.iterdir() if "Traceback" in p.read_text()]


def test_sigint_stops_server_and_workers_without_tracebacks():
    proc = subprocess.Popen([sys.executable, "-m", "tracegym.cli.main", "serve", SPEC, "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        address = _read_address(proc, proc.stdout)
        assert wait_for(lambda: len(ready_pids(address)) == 3, 20)  # two workers and the spare
        pids = ready_pids(address)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group gets it
        _, err = proc.communicate(timeout=15)
    finally:
        stop(proc, 10.0, group=True)
    assert proc.returncode == 0 and b"Traceback" not in err
    assert not [p for p in pids if alive(p)]


def ready_pids(address: str) -> list[int]:
    """The server's worker pids (its spare's too) once every worker is ready, else []."""

    async def ask() -> dict:
        async with EnvClient(address) as client:
            return await client.health()

    health = asyncio.run(ask())
    workers = health["workers"]
    return health["pids"] if workers["ready"] + workers["spare"] == len(health["pids"]) else []


def test_a_local_server_whose_parent_is_killed_stops_with_its_workers():
    parent = subprocess.Popen([sys.executable, "-c", ORPHANING], stdout=subprocess.PIPE, text=True)
    address = parent.stdout.readline().strip()
    pids = wait_for(lambda: ready_pids(address), 20) and ready_pids(address)
    server = _server_pid(address)
    parent.kill()  # kill -9: no cleanup runs in the parent
    parent.wait()
    assert wait_for(lambda: not alive(server) and not [p for p in pids if alive(p)], 10)


ORPHANING = f"""
import time
from tracegym.serve import local_server
with local_server({SPEC!r}, {{}}, workers=1) as address:
    print(address, flush=True)
    time.sleep(60)
"""


def _server_pid(address: str) -> int:
    async def ask() -> dict:
        async with EnvClient(address) as client:
            return await client.health()

    return asyncio.run(ask())["pid"]
