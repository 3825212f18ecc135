"""`tracegym serve`: run an env server for one taskset in the foreground and print its bound address."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_config import BaseConfig

from tracegym.config.command_line import parse_command
from tracegym.core.errors import UsageError
from tracegym.envs.registry import load_taskset
from tracegym.envs.task_sandbox import check_taskset
from tracegym.envs.taskset_section import typed_by_taskset
from tracegym.eval.eval_config import find_taskset_id
from tracegym.interop.openenv_settings import OpenEnvSettings
from tracegym.runtimes import processes
from tracegym.serve.env_server import EnvServer
from tracegym.serve.env_server_choice import WorkerPoolChoice
from tracegym.serve.wire import Address


class ServeTaskset(BaseModel):
    """The taskset to serve and its options (`--taskset.NAME VALUE`, validated by the taskset)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    id: str
    """Taskset id: a built-in, an installed one, `package.module:Name` or `path/to/file.py:Name`."""


class ServeConfig(WorkerPoolChoice, BaseConfig):
    """Serve one taskset to env clients until Ctrl-C or SIGTERM (its worker pool: `WorkerPoolChoice`'s options)."""

    taskset: ServeTaskset
    taskset_json: str | None = None
    """The taskset's options as one JSON object (instead of `--taskset.NAME` flags)."""
    address: Address = "tcp://127.0.0.1:0"
    """Where to listen; port 0 picks a free one. Anything but loopback needs TRACEGYM_ENV_SECRET set."""
    log_dir: Path | None = None
    """Folder for one log file per worker; unset: workers log to this command's stderr."""
    exit_with_parent: bool = False
    """Stop when the process that started this one exits (how `local_server` children avoid orphans)."""
    protocol: Literal["zmq", "openenv"] = "zmq"
    """`zmq`: tracegym's env server (at `--address`, for env clients); `openenv`: OpenEnv's HTTP and WebSocket
    protocol (at `--port`, for OpenEnv clients: one session per WebSocket, each one rollout at a time)."""
    port: int = Field(default=8001, ge=0, le=65535)
    """With `--protocol openenv`: the port (0 picks a free one)."""
    openenv: OpenEnvSettings = OpenEnvSettings()
    """With `--protocol openenv`: the server's host, session limit and idle timeout."""

    def options(self) -> dict:
        """The taskset's options."""
        options = self.taskset.model_dump(exclude={"id"})
        if self.taskset_json:
            try:
                options.update(json.loads(self.taskset_json))
            except json.JSONDecodeError as exc:
                raise UsageError(f"--taskset-json is not JSON: {exc}") from None
        return options


def config_class(taskset_id: str | None) -> type[ServeConfig]:
    """ServeConfig with its `taskset` section typed by that taskset's Config (untyped when unknown), so that
    `--taskset.NAME` flags are parsed as `tracegym eval` parses them."""
    return typed_by_taskset(ServeConfig, taskset_id)


def run(args: list[str]) -> int:
    """Bind, print `address: ...`, serve until SIGINT/SIGTERM, then stop every worker."""
    if args and not args[0].startswith("-"):
        args = ["--taskset.id", args[0], *args[1:]]
    cfg, _ = parse_command(config_class(find_taskset_id(args)), args, prog="tracegym serve")
    if cfg.protocol == "openenv":
        return serve_openenv(cfg)
    server = EnvServer(cfg.taskset.id, cfg.options(), address=cfg.address, size=cfg.size(), log_dir=cfg.log_dir,
                       worker_timeout=cfg.worker_timeout, exit_with_parent=cfg.exit_with_parent,
                       max_abandoned_threads=cfg.max_abandoned_threads, max_request_bytes=cfg.max_request_bytes,
                       max_open_bytes=cfg.max_open_bytes, max_peer_bytes=cfg.max_peer_bytes,
                       max_server_bytes=cfg.max_server_bytes, sandbox=cfg.sandbox, runtime=cfg.runtime,
                       harness=cfg.harness)
    check_taskset(server.taskset)  # a sandbox this host cannot run as asked fails here, before any worker starts
    address = server.bind()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: server.stop())
    print(f"address: {address}", flush=True)
    print(f"serving {server.taskset.id} with {cfg.size().min}+ workers (worker timeout {cfg.worker_timeout:g} s); "
          "Ctrl-C to stop", file=sys.stderr, flush=True)
    server.serve()
    return 0


def serve_openenv(cfg: ServeConfig) -> int:
    """Bind, print `address: ws://...`, serve over OpenEnv until SIGINT/SIGTERM."""
    from tracegym.interop.openenv_server import OpenEnvServer  # imports openenv: only when asked for

    taskset = load_taskset(cfg.taskset.id, cfg.options()).with_runtime(cfg.runtime).with_harness(cfg.harness)
    check_taskset(taskset)
    server = OpenEnvServer.from_settings(taskset, cfg.openenv, source=(cfg.taskset.id, cfg.options()))
    sock = server.bind(cfg.openenv.host, cfg.port)
    if cfg.exit_with_parent:
        processes.watch_parent(lambda: os.kill(os.getpid(), signal.SIGTERM))  # uvicorn stops on SIGTERM
    print(f"address: {server.scheme}://{cfg.openenv.host}:{sock.getsockname()[1]}", flush=True)
    print(f"serving {server.taskset.id} over OpenEnv (at most {cfg.openenv.max_concurrent_envs} sessions, "
          f"{cfg.openenv.workers or 'no'} worker processes); Ctrl-C to stop", file=sys.stderr, flush=True)
    server.serve(sock)
    return 0
