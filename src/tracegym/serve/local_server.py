"""Local server: `tracegym serve` started as a child process for the length of a `with` block."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.runtimes import processes
from tracegym.serve.env_server_choice import WorkerPoolChoice

START_TIMEOUT = 60.0
STOP_GRACE_S = 10.0
"""Seconds the server gets to stop its workers after SIGTERM, before its group gets SIGKILL."""


@contextlib.contextmanager
def local_server(taskset_id: str, taskset_options: dict[str, Any] | None = None, *,
                 pool: WorkerPoolChoice | None = None, workers: int | None = None, elastic: bool = False,
                 log_dir: Path | None = None, address: str = "tcp://127.0.0.1:0", extra_args: list[str] | None = None,
                 under: list[str] | None = None) -> Iterator[str]:
    """Start `tracegym serve TASKSET` in its own process group, yield its bound address, stop the group on exit.
    `pool`: its worker pool and workers' limits (unset: `tracegym serve`'s defaults); `workers` / `elastic` are
    short for `pool=WorkerPoolChoice(workers=...)` / `(elastic=True)`. `under`: a command the server runs under,
    which must exec it (`ip netns exec NAME`: in another network namespace)."""
    if pool is not None and (workers is not None or elastic):
        raise UsageError("local_server: give the worker pool as `pool` or as `workers` / `elastic`, not both")
    pool = pool if pool is not None else WorkerPoolChoice(workers=workers, elastic=elastic)
    command = [*(under or []), sys.executable, "-m", "tracegym.cli.main", "serve", taskset_id, "--address", address,
               "--taskset-json", json.dumps(taskset_options or {}), "--exit-with-parent", *pool.serve_args(),
               *(extra_args or [])]
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        command += ["--log-dir", str(log_dir)]
    err = open(log_dir / "server.log", "ab") if log_dir is not None else None  # noqa: SIM115
    proc = processes.spawn_group(command, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None  # a pipe: we read the address from it
    try:
        yield _read_address(proc, proc.stdout)
    finally:
        processes.stop(proc, STOP_GRACE_S, group=True)  # SIGKILL for any worker that outlived the server
        proc.stdout.close()
        if err is not None:
            err.close()


def _read_address(proc: subprocess.Popen, out: IO[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], 0.1)
        if ready:
            line = out.readline().decode()
            if line.startswith("address: "):
                return line.split(": ", 1)[1].strip()
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    raise InfrastructureError(f"env server did not start (exit {proc.poll()}); see its stderr or server.log")

