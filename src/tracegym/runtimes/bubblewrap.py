"""Bubblewrap: the `bubblewrap` runtime; programs run inside `bwrap` (Debian's `bubblewrap`), seeing only the
sandbox view (`runtimes.sandbox_view`), with no network and a PID namespace of their own.

Every namespace bwrap offers is unshared (user, PID, network, IPC, UTS, cgroup; `Limits.network` keeps the
host's network). The view: the system folders read-only, /etc without its secrets, bwrap's own minimal /dev (and
the nodes `Limits.devices` names, bound with `--dev-bind`) and /proc, an empty read-only /run and /var/run, the
sandbox's own /tmp, /var/tmp, /dev/shm and home and its working directory (one tmpfs of `disk_mb`; not root, held
by the sandbox's keeper, in whose namespaces bwrap starts: see `runtimes.workdir`), what `Limits.read_only`
names, read-only, and nothing of tracegym, its venv, the project or the host's home; the root itself is
read-only. bwrap sets no_new_privs and drops every capability,
starts a new session (no terminal to inject into) and, with `--die-with-parent`, kills the whole sandbox when it
dies. The program init is the namespace's pid 1 (`--as-pid-1`): it reaps what the program orphans, the kernel
ignores the program's signals to it (a program cannot end its own sandbox early), and its exit ends every process
left. As root, bwrap itself runs under the sandbox's own host uid (so RLIMIT_NPROC counts only its processes);
that needs unprivileged user namespaces, which the probe checks.

Under an egress allow-list (`Limits.egress`, see `runtimes.egress`) the init alone gets the capabilities to let
the allowed destinations in, and the program none (`EGRESS_FLAGS`).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from tracegym.runtimes.egress import EgressRoute
from tracegym.runtimes.process_sandbox import (
    PROBE_TIMEOUT_S,
    UID_RANGE,
    Confinement,
    Launch,
    ProcessSandbox,
    socket_folders,
    spawn_as,
)
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable
from tracegym.runtimes.sandbox_view import Kind, Mount, mounts
from tracegym.runtimes.workdir import enter_disk, make_workdir, remove_workdir


class BwrapConfinement(Confinement):
    """`bwrap` around the init, building the sandbox's view (see `runtimes.sandbox_view`)."""

    private_tmp = True
    disk_namespace = True

    def wrap(self, launch: Launch) -> list[str]:
        view = mounts(launch.workdir, launch.limits, socket_folders(launch),
                      None if launch.egress is None else launch.egress.hosts)
        extra = EGRESS_FLAGS if launch.egress is not None else []
        return [*bwrap_flags(view, launch.workdir, launch.limits.network, extra), "--", *launch.init]

    def egress_setup(self, route: EgressRoute, uid: int | None) -> list[str]:
        # the hosts file is in the view; the program leaves the init's capabilities behind (EGRESS_FLAGS)
        ids = (uid, uid) if uid is not None else (os.getuid(), os.getgid())
        return [f"userns {ids[0]} {ids[1]}"]

    def spawn_user(self, uid: int | None) -> int | None:
        return uid

    def init_drops_to(self, uid: int | None) -> int | None:
        return None


EGRESS_FLAGS = ["--uid", "0", "--gid", "0", "--cap-add", "CAP_NET_ADMIN", "--cap-add", "CAP_NET_BIND_SERVICE",
                "--cap-add", "CAP_SETFCAP"]
"""The `bwrap` flags of a run under an egress allow-list (its relay's folder and hosts file are in the view): the
init as root of bwrap's user namespace (the one that owns the network namespace) with CAP_NET_ADMIN, to add the
allowed addresses to the loopback, CAP_NET_BIND_SERVICE, to listen on ports below 1024 (443), and CAP_SETFCAP, to
map the program's own user namespace onto it. The program runs one user namespace further down (`userns`, see
`program_init`) as the uid it has without an allow-list, with no capability over the namespaces above."""


_FLAGS: dict[Kind, Callable[[Mount], list[str]]] = {
    "ro": lambda m: ["--ro-bind", m.source, m.target], "rw": lambda m: ["--bind", m.source, m.target],
    "device": lambda m: ["--dev-bind", m.source, m.target], "empty": lambda m: ["--tmpfs", m.target],
    "symlink": lambda m: ["--symlink", m.source, m.target], "devfs": lambda m: ["--dev", m.target],
    "proc": lambda m: ["--proc", m.target]}
"""The bwrap flags that make each kind of mount of a view."""


def bwrap_flags(view: list[Mount], workdir: Path, network: bool, extra: Sequence[str] = ()) -> list[str]:
    """The `bwrap` command line (without the command) that builds `view`, with `extra` flags (an allow-list's),
    and starts in `workdir`."""
    flags = ["bwrap", "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session",
             *(["--share-net"] if network else []), *(_our_ids() if "--uid" not in extra else [])]
    for mount in view:
        flags += _FLAGS[mount.kind](mount)
    flags += extra  # before the remounts: its mountpoints are made in folders still writable
    for target in (*(m.target for m in view if m.kind == "empty"), "/"):  # last: mounts inside need them writable
        flags += ["--remount-ro", target]
    return [*flags, "--chdir", str(workdir)]


def _our_ids() -> list[str]:
    """Not root, the program runs as our uid and gid, whoever bwrap runs as (root of the namespaces of the keeper
    that caps the sandbox's files: see `runtimes.workdir`)."""
    return [] if os.geteuid() == 0 else ["--uid", str(os.getuid()), "--gid", str(os.getgid())]


@functools.cache
def probe() -> str | None:
    """Why bwrap cannot run here, or None when a trial sandbox started; tried once per process."""
    if not shutil.which("bwrap"):
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    root = os.geteuid() == 0
    uid = random.randrange(*UID_RANGE) if root else None
    workdir, _ = make_workdir(f"{os.getpid()}-bwrap-probe", uid, disk_mb=1, namespaced=True)
    try:
        view = mounts(workdir, Limits())
        done = subprocess.run([*enter_disk(workdir.parent), *bwrap_flags(view, workdir, network=False), "--", "true"],
                              capture_output=True, timeout=PROBE_TIMEOUT_S, **spawn_as(uid))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start: {exc}"
    finally:
        remove_workdir(workdir.parent)
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
