"""Bubblewrap: the `bubblewrap` runtime; programs run inside `bwrap` (Debian's `bubblewrap`) with the host's
filesystem read-only, a private /tmp and working directory, no network and a PID namespace of their own.

Every namespace bwrap offers is unshared (user, PID, network, IPC, UTS, cgroup; `Limits.network` keeps the
host's network). The host's root is bound read-only; /tmp, /var/tmp, /dev/shm and the host user's home are
empty tmpfs; /dev and /proc are the sandbox's own; only the working directory is bound writable. bwrap sets
no_new_privs and drops every capability, starts a new session (no terminal to inject into) and, with
`--die-with-parent`, kills the whole sandbox when it dies. The program init is the namespace's pid 1
(`--as-pid-1`): it reaps what the program orphans, the kernel ignores the program's signals to it (a program
cannot end its own sandbox early), and its exit ends every process left. As root, bwrap itself runs under the
sandbox's own host uid (so RLIMIT_NPROC counts only its processes); that needs unprivileged user namespaces,
which the probe checks.

Under an egress allow-list (`Limits.egress`, see `runtimes.egress`) the init alone gets the capabilities to let
the allowed destinations in, and the program none (`egress_flags`).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from tracegym.runtimes.egress import EgressRoute
from tracegym.runtimes.process_sandbox import (
    PROBE_TIMEOUT_S,
    SCRATCH,
    UID_RANGE,
    Confinement,
    Launch,
    ProcessSandbox,
    spawn_as,
)
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable


class BwrapConfinement(Confinement):
    """`bwrap` around the init: read-only host, private scratch folders, the working directory writable."""

    private_tmp = True

    def wrap(self, launch: Launch) -> list[str]:
        flags = bwrap_flags(launch.workdir, launch.limits.network, launch.limits.disk_mb)
        if launch.forward is not None:  # the init carries the loopback port to this socket: the host's, read-only
            folder = str(launch.forward.socket.parent)
            flags += ["--ro-bind", folder, folder]
        if launch.egress is not None:
            flags += egress_flags(launch.egress)
        return [*flags, "--", *launch.init]

    def egress_setup(self, route: EgressRoute, uid: int | None) -> list[str]:
        # bwrap binds the hosts file; the program leaves the init's capabilities behind (see egress_flags)
        ids = (uid, uid) if uid is not None else (os.getuid(), os.getgid())
        return [f"userns {ids[0]} {ids[1]}"]

    def spawn_user(self, uid: int | None) -> int | None:
        return uid

    def init_drops_to(self, uid: int | None) -> int | None:
        return None


def egress_flags(route: EgressRoute) -> list[str]:
    """The `bwrap` flags of a run under an egress allow-list: the relay's folder and hosts file bound in, and the
    init as root of bwrap's user namespace (the one that owns the network namespace) with CAP_NET_ADMIN, to add
    the allowed addresses to the loopback, CAP_NET_BIND_SERVICE, to listen on ports below 1024 (443), and
    CAP_SETFCAP, to map the program's own user namespace onto it. The program runs one user namespace further
    down (`userns`, see `program_init`) as the uid it has without an allow-list, with no capability over the
    namespaces above."""
    folder = str(route.folder)
    flags = ["--uid", "0", "--gid", "0", "--ro-bind", folder, folder]
    for capability in ("CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_SETFCAP"):
        flags += ["--cap-add", capability]
    return flags if route.hosts is None else [*flags, "--ro-bind", str(route.hosts), "/etc/hosts"]


def bwrap_flags(workdir: Path, network: bool, disk_mb: int) -> list[str]:
    """The `bwrap` command line (without the command) for a sandbox with this working directory."""
    flags = ["bwrap", "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
             "--dev", "/dev", "--proc", "/proc"]
    if network:
        flags.append("--share-net")
    home = Path.home()
    for folder in (*SCRATCH, *([str(home)] if home != Path("/") and home.is_dir() else [])):
        flags += ["--size", str(disk_mb << 20), "--tmpfs", folder]
    return [*flags, "--bind", str(workdir), str(workdir), "--chdir", str(workdir)]


@functools.cache
def probe() -> str | None:
    """Why bwrap cannot run here, or None when a trial sandbox started; tried once per process."""
    if not shutil.which("bwrap"):
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    root = os.geteuid() == 0
    uid = random.randrange(*UID_RANGE) if root else None
    with tempfile.TemporaryDirectory(prefix="tracegym-bwrap-probe-") as folder:
        if uid is not None:
            os.chown(folder, uid, uid)
        ids = spawn_as(uid)
        try:
            done = subprocess.run([*bwrap_flags(Path(folder), network=False, disk_mb=1), "--", "true"],
                                  capture_output=True, timeout=PROBE_TIMEOUT_S, **ids)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap could not start: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"exit status {done.returncode}"
        needs = " (it needs unprivileged user namespaces)" if root else ""
        return f"bwrap cannot create its sandbox here{needs}: {why}"
    return None


class Bubblewrap:
    """The `bubblewrap` runtime: see the module docstring for what its sandboxes guarantee."""

    name = "bubblewrap"

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    def unavailable(self) -> str | None:
        return probe()

    async def open(self) -> ProcessSandbox:
        reason = self.unavailable()
        if reason:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {reason}")
        return ProcessSandbox(BwrapConfinement(), self.limits)
