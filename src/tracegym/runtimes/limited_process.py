"""Limited process: the `subprocess` runtime; programs run as host processes under rlimits, in namespaces of their
own where the machine allows, else in a process group of their own.

What each isolation guarantees (the strongest this host allows is detected once per process):

- `namespaces` (we are root): `unshare` gives the program a PID namespace (the program init is its pid 1: its
  exit, a wall-clock kill or a cancel ends every process of the sandbox, `setsid` daemons included), a network
  namespace with only a loopback that is down (no connection leaves it, 127.0.0.1 included; `Limits.network`
  keeps the host's network) and a mount namespace in which the init builds the sandbox view before the program
  starts (`runtimes.sandbox_view`: the system folders read-only, /etc without its secrets, a minimal /dev and
  the nodes `Limits.devices` names, its own /proc, empty /run, its own /tmp, /var/tmp, /dev/shm and home sharing
  the working directory's disk cap, what `Limits.read_only` names; nothing of tracegym, its venv, the project,
  the host's home or its Unix sockets), then pivots into it. The program runs under a host uid of its own with
  no capabilities and no_new_privs, so it can write only its working directory and its own scratch folders, and
  signal none of the host's processes; RLIMIT_NPROC counts its processes alone.
- `user-namespaces` (not root, unprivileged user namespaces allowed): the same namespaces and view, entered
  through a user namespace; the program keeps our uid (as the namespace's root, every capability dropped for
  good before it starts, so it cannot undo a mount), its files are uncapped, and RLIMIT_NPROC counts our other
  processes too (it is set to their number now plus the limit).
- `process-group` (no namespaces): a session and process group of its own; a wall-clock kill or a cancel kills
  the group, and every process still carrying the run's marker in its environment is found in /proc and killed
  (a daemon that leaves the group *and* clears its environment escapes this); no network isolation and no view
  (it sees the host's filesystem and /dev; `Limits.read_only` and `Limits.devices` change nothing); as root, the
  program still runs under a uid of its own.

In all three: rlimits on CPU seconds, address space, file size, open files and processes; a wall-clock limit;
a fresh working directory per sandbox, removed at close; an environment with nothing of the host's.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Literal

from tracegym.runtimes.process_sandbox import PROBE_TIMEOUT_S, Confinement, Launch, ProcessSandbox
from tracegym.runtimes.program_init import VIEW_OPTION, encode_view
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable
from tracegym.runtimes.sandbox_view import expand_devfs, mounts
from tracegym.runtimes.workdir import VIEW_ROOT

Isolation = Literal["namespaces", "user-namespaces", "process-group"]


class NamespaceConfinement(Confinement):
    """`unshare` wraps the init in PID, mount and network namespaces (a user namespace too when we are not root);
    the init builds the sandbox's view in its mount namespace (see `runtimes.sandbox_view`)."""

    private_tmp = True

    def __init__(self, as_root: bool) -> None:
        self.as_root = as_root

    def wrap(self, launch: Launch) -> list[str]:
        forward = None if launch.forward is None else launch.forward.socket.parent  # the init carries a port to it
        view = expand_devfs(mounts(launch.workdir, launch.limits, forward))
        spec = encode_view(str(launch.workdir.parent / VIEW_ROOT), [(m.kind, m.target, m.source) for m in view])
        python, *init = launch.init
        return [*unshare_flags(self.as_root, launch.limits.network), "--", *_no_new_privs(), python,
                "-X", f"{VIEW_OPTION}={spec}", *init]


class GroupConfinement(Confinement):
    """No namespaces: the init leads a process group of its own; a sweep by environment marker does the rest."""

    kills_on_init_exit = False
    network_namespace = False

    def wrap(self, launch: Launch) -> list[str]:
        return [*_no_new_privs(), *launch.init]


def unshare_flags(as_root: bool, network: bool) -> list[str]:
    """The `unshare` command line (without the command) for a sandbox's namespaces."""
    flags = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if not as_root:
        flags += ["--user", "--map-root-user"]
    return flags if network else [*flags, "--net"]


def _no_new_privs() -> list[str]:
    """`setpriv --no-new-privs --`: a setuid binary run by the program gains nothing (empty when missing)."""
    return ["setpriv", "--no-new-privs", "--"] if shutil.which("setpriv") else []


@functools.cache
def detect_isolation() -> Isolation:
    """The strongest isolation this host allows, tried once per process."""
    if not shutil.which("unshare"):
        return "process-group"
    as_root = os.geteuid() == 0
    probe = [*unshare_flags(as_root, network=False), "--", "true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        return "process-group"
    return "namespaces" if as_root else "user-namespaces"


class LimitedProcess:
    """The `subprocess` runtime: see the module docstring for what each isolation guarantees."""

    name = "subprocess"

    def __init__(self, limits: Limits | None = None, *, isolation: Isolation | None = None) -> None:
        self.limits = limits or Limits()
        self._isolation = isolation

    @property
    def isolation(self) -> Isolation:
        """The isolation its sandboxes get: the one asked for, else the strongest detected."""
        return self._isolation or detect_isolation()

    def unavailable(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"it needs Linux (/proc, rlimits, namespaces); this is {sys.platform}"
        return None

    async def open(self) -> ProcessSandbox:
        reason = self.unavailable()
        if reason:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {reason}")
        if self.isolation == "process-group":
            return ProcessSandbox(GroupConfinement(), self.limits)
        return ProcessSandbox(NamespaceConfinement(as_root=self.isolation == "namespaces"), self.limits)
