"""Sandbox: one rollout's place to run programs: a fresh working directory, resource limits, and the Runtime that
makes it (a limited subprocess, bubblewrap, a container).

The contract every runtime keeps: `Runtime.open()` gives a Sandbox with its own empty working directory;
`Sandbox.run()` runs one program there under the sandbox's limits and always returns a ProgramResult (a program
that fails, hangs, floods its output or breaks a limit is data, never an exception); `Sandbox.close()` reaps every
process the sandbox started, daemons included, and removes the working directory. Closing twice is harmless.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tracegym.core.errors import ErrorKind, FailureKind, TracegymError
from tracegym.runtimes.egress import parse_entry
from tracegym.runtimes.sandbox_view import refusal
from tracegym.runtimes.workdir import READ_CAP_BYTES


class Limits(BaseModel):
    """What one program may use. Every limit is enforced per program run, not per sandbox, but `disk_mb`: the
    sandbox's files outlive its runs, so the limits it was opened with cap them. `memory_mb` and `processes` cap
    a run's processes all together where the sandbox has a cgroup (`ProgramResult.memory_scope` says which)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    wall_seconds: float = Field(60.0, gt=0)
    """Wall-clock time; past it the program's whole process tree is killed."""
    cpu_seconds: int = Field(60, gt=0)
    """CPU time of each process (RLIMIT_CPU)."""
    memory_mb: int = Field(1024, gt=0)
    """Memory of all the program's processes together, no swap (the sandbox's cgroup: see `runtimes.cgroup`; the
    files it writes to a tmpfs count, they are RAM); where no cgroup can be made, the address space of each
    process (RLIMIT_AS)."""
    file_size_mb: int = Field(64, gt=0)
    """Largest file a process may write (RLIMIT_FSIZE)."""
    open_files: int = Field(256, gt=0)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    processes: int = Field(64, gt=0)
    """Processes (threads count) the program may have at once: its cgroup's `pids.max`, and RLIMIT_NPROC."""
    output_bytes: int = Field(1_000_000, gt=0)
    """Bytes kept of each of stdout and stderr; the rest is read and dropped (the program is not blocked)."""
    disk_mb: int = Field(1024, gt=0)
    """Megabytes the sandbox's files may take in all: its working directory, /tmp, /var/tmp, /dev/shm and home
    share one tmpfs of this size (host RAM, used only as filled): on the host where we are root, in a keeper's
    namespaces where we are not (bubblewrap, subprocess); uncapped elsewhere, which the log says (see
    `runtimes.workdir`)."""
    network: bool = False
    """Whether the program may reach the network (off: a network namespace with only its own loopback)."""
    egress: tuple[str, ...] = ()
    """Without `network`, the `HOST:PORT`s (TCP) the program may still reach: IPv4 addresses, IPv6 addresses in
    brackets or hostnames (looked up on the host); nothing else routes (see `runtimes.egress`). Only runtimes with
    a network namespace and a program init can enforce it: the others refuse it, naming it."""

    @field_validator("egress")
    @classmethod
    def _well_formed(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            parse_entry(entry)  # ValueError naming the entry
        return entries

    @model_validator(mode="after")
    def _egress_without_network(self) -> Limits:
        if self.network and self.egress:
            raise ValueError(f"egress {list(self.egress)} is an allow-list for a sandbox without network; with "
                             "network=True the program reaches every host already (drop one of them)")
        return self
    read_only: tuple[str, ...] = ()
    """Host paths (agent code, its venv) the sandbox sees read-only at the same path; each must exist. Namespaced
    sandboxes see no other host path but the system folders (see `runtimes.sandbox_view`)."""
    devices: tuple[str, ...] = ()
    """Host device nodes (e.g. `/dev/nvidia0`) the sandbox's /dev shows beside its minimal set (null, zero, full,
    random, urandom, tty); each must exist and be a device."""

    strict_caps: bool = False
    """Refuse to open a sandbox where `memory_mb`, `processes` and `disk_mb` cannot cap its processes and files as
    a whole (no cgroup can be made on this host, or no tmpfs for its files: not root), instead of capping each
    process alone (rlimits) and its files not at all, with a warning. Checked before any rollout starts (see
    `runtimes.preflight`) and at each open."""

    @field_validator("read_only")
    @classmethod
    def _existing_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise ValueError(f"{path!r} is not an existing absolute path on this host")
            if why := refusal(path):
                raise ValueError(why)
        return paths

    @field_validator("devices")
    @classmethod
    def _device_nodes(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            try:
                mode = os.stat(path).st_mode
            except OSError as exc:
                raise ValueError(f"{path!r} does not exist on this host ({exc.strerror})") from None
            if not os.path.isabs(path) or not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
                raise ValueError(f"{path!r} is not a device node (an absolute path to a character or block device)")
        return paths


@dataclass(frozen=True)
class Forward:
    """A host service a program without network may still reach: `127.0.0.1:port` inside the sandbox is carried
    to the Unix socket `socket` on the host (the interception proxy). A sandbox that shares the host's network
    (`Limits.network`, or no network namespace at all) reaches the host's own 127.0.0.1:port instead."""

    port: int
    socket: Path


class ProgramResult(BaseModel):
    """How one program run ended. `limit` names the limit that ended it (`wall`, `cpu`, `memory`, `file_size`,
    `disk`, `processes`, `output`; `sandbox` when the sandbox's init was killed before the program reported, which
    only a program outside a PID namespace and under our own uid can do), None when it ended on its own."""

    argv: list[str]
    exit_code: int | None
    """The exit status; None when the program never started or was killed by a signal."""
    signal: int | None = None
    """The signal that ended it, if one did."""
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    limit: str | None = None
    duration_s: float = 0.0
    left_running: int = 0
    """Processes the program started that were still running when it ended (the sandbox killed them: a daemon)."""
    start_error: str | None = None
    """Why the program could not start at all (no such command, not executable)."""
    egress_connections: dict[str, int] = Field(default_factory=dict)
    """Per entry of `Limits.egress`, the connections the program opened to it (0 for an entry it never used)."""
    refused_connections: int | None = None
    """What the run's own network namespace refused: connections and datagrams with no route out, TCP connections
    nothing listened for (the host's 127.0.0.1 ports among them), datagrams to no socket. None where the run shares
    the host's network or its runtime has no program init (nothing counted)."""
    memory_scope: Literal["sandbox", "process"] = "sandbox"
    """What `Limits.memory_mb` and `processes` capped: the sandbox's processes all together (its cgroup, or a
    container engine's), or each process alone (rlimits: no cgroup could be made on this host)."""

    @property
    def ok(self) -> bool:
        """True when the program started, ended on its own and exited 0."""
        return self.start_error is None and self.limit is None and self.exit_code == 0


@runtime_checkable
class Sandbox(Protocol):
    """One rollout's sandbox: a working directory and the programs run in it."""

    @property
    def workdir(self) -> Path:
        """The working directory on the host, until `close` (the host reads and writes in it only through
        `read_file` and `write_file`: the program owns it and may have left links there)."""
        ...

    def write_file(self, name: str, content: str | bytes) -> None:
        """Write `content` to `name` (a path inside the working directory) as a new file the program may read and
        replace; a link the program left there is replaced, never followed (see `runtimes.workdir`)."""
        ...

    def read_file(self, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
        """The first `cap` bytes of regular file `name` in the working directory, never through a link; None when
        there is none."""
        ...

    def cannot_forward(self) -> str | None:
        """Why `run(forward=...)` cannot carry a connection to the host here, or None when it can."""
        ...

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                  limits: Limits | None = None, forward: Forward | None = None) -> ProgramResult:
        """Run one program in the working directory with a scrubbed environment plus `env`, and wait for it;
        with `forward`, the program reaches that host service on its own loopback (see Forward)."""
        ...

    async def close(self) -> None:
        """Reap every process the sandbox started and remove its working directory."""
        ...


@runtime_checkable
class Runtime(Protocol):
    """Makes sandboxes of one kind."""

    name: str

    def unavailable(self) -> str | None:
        """Why this runtime cannot run on this host (e.g. `bwrap` is not installed), or None when it can."""
        ...

    async def open(self) -> Sandbox:
        """A new sandbox with an empty working directory."""
        ...


class RuntimeUnavailable(TracegymError):
    """The runtime a task or harness asked for cannot run on this host; says which and why."""

    kind = ErrorKind.INFRASTRUCTURE
    failure = FailureKind.SANDBOX_ERROR
