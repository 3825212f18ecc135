"""vLLM servers: several vLLM servers of one model started side by side on this machine, and stopped together.

Each gets its own port and log (`vllm.log`, `vllm-1.log`, ...) and, on the CPU build, its own share of the cores
this process may use (`VLLM_CPU_OMP_THREADS_BIND`), so the servers do not fight over the same cores. They start
one after another, and all are stopped when any fails to start. A client reaches them as one Endpoint with
replicas (`models.router`).

>>> with VLLMServers(server_config(choice), count=2) as servers:  # doctest: +SKIP
...     servers.base_urls  # ['http://127.0.0.1:PORT/v1', 'http://127.0.0.1:PORT2/v1']
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tracegym.core.errors import UsageError
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig, is_cpu_build

CORES_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""vllm-cpu's variable naming the cores its model threads run on (`0-3`, `4,5`)."""


def server_configs(config: VLLMServerConfig, count: int, shares: list[str] | None = None) -> list[VLLMServerConfig]:
    """`count` servers of `config`: the first logs where `config` says, the others beside it (`-1`, `-2`, ...);
    on the CPU build each is bound to its own share of the cores (unless `config.env` binds them already):
    `shares[i]` where given (the caller keeps other cores for another server), else an equal share of all."""
    if count < 1:
        raise UsageError(f"servers must be at least 1, got {count}")
    if shares is None:
        shares = core_shares(count) if count > 1 and is_cpu_build() and CORES_ENV not in config.env else None
    configs = []
    for index in range(count):
        update: dict[str, object] = {"log_path": _numbered(config.log_path, index)}
        if shares is not None:
            update["env"] = {**config.env, CORES_ENV: shares[index]}
        configs.append(config.model_copy(update=update))
    return configs


def core_shares(count: int, cores: list[int] | None = None) -> list[str]:
    """The cores (`sched_getaffinity`, or `cores`) split into `count` contiguous shares, as vllm-cpu writes a
    core list (`0,1`); a UsageError when there are fewer cores than servers.

    >>> core_shares(2, [0, 1, 2, 3, 4])
    ['0,1,2', '3,4']
    """
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if len(cores) < count:
        raise UsageError(f"{count} vLLM servers need at least {count} CPU cores here; this process may use "
                         f"{len(cores)} ({', '.join(map(str, cores))})")
    size, extra = divmod(len(cores), count)
    shares, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        shares.append(",".join(map(str, cores[start:end])))
        start = end
    return shares


def _numbered(path: Path | None, index: int) -> Path | None:
    if path is None or index == 0:
        return path
    return path.with_name(f"{path.stem}-{index}{path.suffix}")


class VLLMServers:
    """`count` servers of `config`, started by `start()` (or `with`), stopped with every process they spawned."""

    def __init__(self, config: VLLMServerConfig, count: int, shares: list[str] | None = None) -> None:
        self.servers = [VLLMServer(c) for c in server_configs(config, count, shares)]

    @property
    def base_urls(self) -> list[str]:
        """Each server's `http://host:port/v1`, in start order; only after `start()`."""
        return [server.base_url for server in self.servers]

    def start(self) -> list[str]:
        """Start the servers one after another (on a CPU their startups would only share the cores; in this
        thread, Ctrl-C stops a start at once) until all are healthy; if one fails, stop them all and raise."""
        with contextlib.ExitStack() as undo:
            undo.callback(self.stop)
            for server in self.servers:
                server.start()
            undo.pop_all()
        return self.base_urls

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def running(self) -> list[VLLMServer]:
        """The servers whose process still runs."""
        return [server for server in self.servers if server.running()]

    def __enter__(self) -> VLLMServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
