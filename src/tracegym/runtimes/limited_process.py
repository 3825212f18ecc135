"""Limited process: the `subprocess` runtime; programs run as host processes under rlimits, in namespaces of their
own where the machine allows, else in a process group of their own.

What each isolation guarantees (the strongest this host allows is detected once per process):

- `namespaces` (we are root): `unshare` gives the program a PID namespace (the program init is its pid 1: its exit, a
  wall-clock kill or a cancel ends every process of the sandbox, `setsid` daemons included), a network namespace with
  only a loopback that is down (no connection leaves it, 127.0.0.1 included; `Limits.network` keeps the host's
  network; `Limits.egress` lets named hosts and ports through, see `runtimes.egress`) and a mount namespace in which
  the init builds the sandbox view before the program starts (`runtimes.sandbox_view`: the system folders read-only,
  /etc without its secrets, a minimal /dev and the nodes `Limits.devices` names, its own /proc, empty /run, its own
  /tmp, /var/tmp, /dev/shm and home sharing the working directory's disk cap, what `Limits.read_only` names; nothing
  of tracegym, its venv, the project, the host's home or its Unix sockets), then pivots into it. The program runs
  under a host uid of its own with no capabilities and no_new_privs, so it can write only its working directory and
  its own scratch folders, and signal none of the host's processes; RLIMIT_NPROC counts its processes alone.
- `user-namespaces` (not root, unprivileged user namespaces allowed): the same namespaces and view, entered
  through a user namespace; the program keeps our uid (as the namespace's root, every capability dropped for
  good before it starts, so it cannot undo a mount), its files capped by the tmpfs of the sandbox's keeper (the
  wrapper starts in the keeper's namespaces: see `runtimes.workdir`), and RLIMIT_NPROC counts our other
  processes too (it is set to their number now plus the limit).
- `process-group` (no namespaces): only when asked for by name (the runtime `process-group`, or
  `LimitedProcess(isolation="process-group")`); where namespaces are missing, the `subprocess` runtime refuses
  to open rather than fall back to it silently, and asked for, it warns once per process. A session and process
  group of its own; when the program ends, the init kills the group, and a wall-clock kill or a cancel kills it
  too; every process still carrying the run's marker in its environment, in the sandbox's cgroup (not root: where
  one is delegated) or, as root, under its uid is found and killed (not root and no cgroup delegated, a daemon
  that leaves the group *and* clears its environment escapes this). It does not isolate the network (every port of
  the host is reachable), other processes' /proc (same-uid processes' environments and command lines are readable
  when not root) or signals (not root, the program may kill any of our processes), so `Limits.egress` is
  refused, naming it; and it has no view: it sees the host's filesystem and /dev (`Limits.read_only` and
  `Limits.devices` change nothing). As root, the program still runs under a uid of its own.

In all three: rlimits on CPU seconds, file size, open files and processes; a wall-clock limit; a fresh working
directory per sandbox, removed at close; an environment with nothing of the host's. As root, a cgroup per sandbox
caps the memory and the processes of all its programs together (`runtimes.cgroup`); not root, so does one under
the cgroup root delegated to the user (`TRACEGYM_CGROUP`, else `/tracegym-<user>`); where none is, memory is
capped per process (RLIMIT_AS), which the result's `memory_scope` and one warning in the log say.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from typing import Final, Literal

from tracegym.runtimes.egress import EgressRoute
from tracegym.runtimes.process_sandbox import PROBE_TIMEOUT_S, Confinement, Launch, ProcessSandbox, socket_folders
from tracegym.runtimes.program_init import VIEW_OPTION, encode_view
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable
from tracegym.runtimes.sandbox_view import expand_devfs, mounts
from tracegym.runtimes.workdir import VIEW_ROOT

Isolation = Literal["namespaces", "user-namespaces", "process-group"]
FALLBACK: Final = "process-group"
"""The catalog name (and isolation) of the fallback without namespaces, which runs only when asked for by it."""
FALLBACK_LACKS = ("the network (every port of the host is reachable), other processes' /proc (not root: the "
                  "environments and command lines of our own processes, rollout keys included, are readable) and "
                  "signals (not root: the program can kill any of our processes)")
"""What the process-group fallback does not isolate."""
log = logging.getLogger(__name__)


class NamespaceConfinement(Confinement):
    """`unshare` wraps the init in PID, mount and network namespaces (a user namespace too when we are not root);
    the init builds the sandbox's view in its mount namespace (see `runtimes.sandbox_view`)."""

    private_tmp = True
    disk_namespace = True

    def __init__(self, as_root: bool) -> None:
        self.as_root = as_root

    def egress_setup(self, route: EgressRoute, uid: int | None) -> list[str]:
        return []  # the hosts file is in the view

    def wrap(self, launch: Launch) -> list[str]:
        view = expand_devfs(mounts(launch.workdir, launch.limits, socket_folders(launch),
                                   None if launch.egress is None else launch.egress.hosts))
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


def detect_isolation() -> Isolation:
    """The strongest isolation this host allows, tried once per process."""
    if no_namespaces():
        return "process-group"
    return "namespaces" if os.geteuid() == 0 else "user-namespaces"


@functools.cache
def no_namespaces() -> str | None:
    """Why `unshare` cannot give a program namespaces here, or None when it can; tried once per process."""
    if not shutil.which("unshare"):
        return "unshare is not installed (Debian/Ubuntu: util-linux)"
    as_root = os.geteuid() == 0
    probe = [*unshare_flags(as_root, network=False), "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare could not run: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        needs = "" if as_root else " (not root, it needs unprivileged user namespaces)"
        return f"unshare cannot make namespaces here{needs}: {said[-1] if said else done.returncode}"
    return None


@functools.cache
def warn_fallback() -> None:
    """Say once per process that the process-group fallback is in use and what it does not isolate."""
    log.warning("the %r sandbox runtime (asked for by name) has no namespaces: it does not isolate %s; use it only "
                "for programs you trust", FALLBACK, FALLBACK_LACKS)


class LimitedProcess:
    """The `subprocess` runtime (named `process-group` when it is asked for that isolation): see the module
    docstring for what each isolation guarantees."""

    name = "subprocess"

    def __init__(self, limits: Limits | None = None, *, isolation: Isolation | None = None) -> None:
        self.limits = limits or Limits()
        self._isolation = isolation
        if isolation == FALLBACK:
            self.name = FALLBACK

    @property
    def isolation(self) -> Isolation:
        """The isolation its sandboxes get: the one asked for, else the strongest detected."""
        return self._isolation or detect_isolation()

    def unavailable(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"it needs Linux (/proc, rlimits, namespaces); this is {sys.platform}"
        if self.isolation == FALLBACK and self._isolation != FALLBACK:
            return (f"{no_namespaces()}. Without namespaces it would run programs in a process group, which does not "
                    f"isolate {FALLBACK_LACKS}; to run them so all the same, ask for it by name: the runtime "
                    f"{FALLBACK!r} (runtime_for({FALLBACK!r}, limits)), or LimitedProcess(isolation={FALLBACK!r})")
        return None

    async def open(self) -> ProcessSandbox:
        reason = self.unavailable()
        if reason:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {reason}")
        if self.isolation == FALLBACK:
            warn_fallback()
            return ProcessSandbox(GroupConfinement(), self.limits)
        return ProcessSandbox(NamespaceConfinement(as_root=self.isolation == "namespaces"), self.limits)
