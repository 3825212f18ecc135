"""Sandbox view: what of the host's filesystem a namespaced sandbox sees (bubblewrap, and the subprocess runtime's
namespace modes), as the list of mounts that make it; each runtime makes them its own way (bwrap's flags, the
program init's mounts).

The host's system folders only (`SYSTEM_FOLDERS`, read-only; merged-usr links recreated as links), /etc without
its secrets (`SECRETS`: /dev/null or an empty folder over each), a minimal /dev (`DEVICES`, and what
`Limits.devices` names), the sandbox's own /proc, and an empty read-only /run and /var/run (no host Unix socket is
reachable by path). /tmp, /var/tmp, /dev/shm and home are the sandbox's own folders (`workdir.private_folders`, one
disk cap where we are root), the working directory is at its host path, and what `Limits.read_only` names (and a
forwarded service's socket folder) is bound read-only at its path. Whatever of the tracegym package, the project
holding its source, the env server's prefix (its venv), the host's home and the host process's working directory
lies inside a bound folder (a tracegym pip-installed into /usr/local, say) is covered by an empty read-only tmpfs;
`Limits.read_only` may not name a path inside one of them (see `refusal`).
"""

from __future__ import annotations

import functools
import glob
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tracegym.runtimes.workdir import private_folders

if TYPE_CHECKING:
    from tracegym.runtimes.sandbox import Limits

SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""The host folders every namespaced sandbox sees, read-only (those this host has; a link stays a link)."""
SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
           "/etc/ssh/ssh_host_*_key", "/etc/ssl/private", "/etc/security/opasswd", "/etc/krb5.keytab")
"""What of /etc a sandbox never reads (glob patterns): a file shows as /dev/null, a folder as an empty one."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
"""The device nodes every sandbox's /dev has (bwrap's `--dev` set); others only as `Limits.devices` names them."""
EMPTY = ("/run", "/var/run")
"""Folders a sandbox sees empty and read-only (a link among them, as /var/run -> /run is, stays a link)."""
_PACKAGE = Path(__file__).resolve().parents[1]
_NEEDED = ("/usr/local/bin", "/usr/local/lib")
"""Folders a hidden path may not contain: where the sandbox's programs and their libraries are."""

_NAMEABLE_INSIDE = ("the host's home", "the host process's working directory", "the env server's venv")

Kind = Literal["ro", "rw", "device", "empty", "symlink", "devfs", "proc"]


@dataclass(frozen=True)
class Mount:
    """One step of building a view: `kind` at `target` (a path inside the sandbox)."""

    kind: Kind
    """`ro`/`rw`: bind `source` (recursively; read-only or not); `device`: bind the device node `source`;
    `empty`: an empty tmpfs, read-only once the view is built; `symlink`: a link to `source`; `devfs`: a minimal
    /dev (`DEVICES`); `proc`: the sandbox's own /proc."""
    target: str
    source: str = ""


def mounts(workdir: Path, limits: Limits, sockets: Sequence[Path] = (), hosts: Path | None = None) -> list[Mount]:
    """The view of a sandbox whose working directory is `workdir`, under `limits`, reaching the Unix socket folders
    `sockets` (the proxy's, an egress relay's), with `hosts` over /etc/hosts (an allow-list's names), in the order
    its mounts are made."""
    private = [Mount("rw", str(inside), str(source)) for inside, source in private_folders(workdir)]
    named = [Mount("ro", path, path) for path in (*limits.read_only, *map(str, sockets))]
    devices = [Mount("device", path, path) for path in limits.devices]
    names = [Mount("ro", "/etc/hosts", str(hosts))] if hosts is not None else []
    return [*_host_view(), *names, *private, *named, Mount("rw", str(workdir), str(workdir)), *_hidden_in(named),
            *devices]


def expand_devfs(view: Iterable[Mount]) -> list[Mount]:
    """`view` with its `devfs` spelled out (an empty /dev, the `DEVICES` this host has, the fd links), for a
    runtime with no minimal /dev of its own."""
    spelled: list[Mount] = []
    for mount in view:
        if mount.kind != "devfs":
            spelled.append(mount)
            continue
        spelled += [Mount("empty", mount.target),
                    *(Mount("device", device, device) for device in DEVICES if os.path.exists(device)),
                    Mount("symlink", f"{mount.target}/fd", "/proc/self/fd"),
                    *(Mount("symlink", f"{mount.target}/{name}", f"/proc/self/fd/{fd}")
                      for fd, name in enumerate(("stdin", "stdout", "stderr")))]
    return spelled


PACKAGE = "the tracegym package"
"""What `hidden_paths` calls the package folder: nothing inside it may be named, wherever it lies."""


def refusal(path: str) -> str | None:
    """Why a sandbox may not see host `path` (it is a hidden path, or lies inside the tracegym package or the
    project), or None when it may: a folder inside the host's home or the env server's venv may be named (its
    site-packages, say, for an agent's libraries; whatever hidden path lies inside stays hidden)."""
    real, hidden = Path(path).resolve(), hidden_paths()
    in_nameable = any(real != h and real.is_relative_to(h) for h, what in hidden.items() if what in _NAMEABLE_INSIDE)
    for place, what in hidden.items():
        inside = real.is_relative_to(place) and what not in _NAMEABLE_INSIDE
        if real == place or (inside and (what == PACKAGE or not in_nameable)):  # the venv may lie in the project
            return f"{path!r} is {what} or lies inside it ({place}), which no sandbox may see"
    return None


@functools.cache
def hidden_paths() -> dict[Path, str]:
    """The host paths no sandbox sees, each resolved, with what it is: the tracegym package, the project holding
    its source, the env server's prefix, the host's home and working directory (those that exist and hold none
    of the system folders)."""
    project = next((p for p in _PACKAGE.parents if (p / "pyproject.toml").is_file()), None)
    found = [(_PACKAGE, PACKAGE), (project, "the project's source"),
             (Path(sys.prefix).resolve(), "the env server's venv"), (Path.home().resolve(), "the host's home"),
             (Path.cwd().resolve(), "the host process's working directory")]
    hidden: dict[Path, str] = {}
    for path, what in found:
        if path is not None and path.exists() and _hideable(path):
            hidden.setdefault(path, what)
    return hidden


def _hideable(path: Path) -> bool:
    """False for a path that is, or holds, a system folder or one the sandbox's programs need."""
    return not any(Path(needed).is_relative_to(path) for needed in (*SYSTEM_FOLDERS, *EMPTY, *_NEEDED))


@functools.cache
def _host_view() -> tuple[Mount, ...]:
    """What of the view is the same for every sandbox on this host: /dev, /proc, the system folders without
    their secrets, empty /run (with a resolv.conf that lives there) and the hidden paths inside them."""
    system = [Mount("symlink", folder, os.readlink(folder)) if os.path.islink(folder) else Mount("ro", folder, folder)
              for folder in SYSTEM_FOLDERS if os.path.lexists(folder)]
    secrets = [Mount("ro", path, "/dev/null") if not os.path.isdir(path) or os.path.islink(path)
               else Mount("empty", path) for pattern in SECRETS for path in sorted(glob.glob(pattern))]
    empty = [Mount("symlink", path, os.readlink(path)) if os.path.islink(path) else Mount("empty", path)
             for path in EMPTY if os.path.lexists(path)]
    resolver = os.path.realpath("/etc/resolv.conf")
    kept = [Mount("ro", resolver, resolver)] if resolver.startswith("/run/") and os.path.isfile(resolver) else []
    return (Mount("devfs", "/dev"), Mount("proc", "/proc"), *system, *secrets, *empty, *kept,
            *_hidden_in(system))


def _hidden_in(bound: Iterable[Mount]) -> list[Mount]:
    """An empty tmpfs over each hidden path that lies strictly inside one of the `bound` folders."""
    covers = []
    for mount in bound:
        if mount.kind != "ro" or not os.path.isdir(mount.source):
            continue
        source = Path(mount.source).resolve()
        for hidden in hidden_paths():
            if hidden != source and hidden.is_relative_to(source):
                covers.append(Mount("empty", str(Path(mount.target) / hidden.relative_to(source))))
    return covers
