"""Cgroup: a sandbox's control group, which caps the memory and the number of processes of all its programs
together and says when either cap fired.

Where it is made: under the cgroup of the process that opens the sandbox (so a sandbox never escapes a cap its
owner is under), named `tracegym-sandbox-<sandbox id>`:

- cgroup v1 (the memory and pids hierarchies mounted apart): `<memory mount>/<our memory cgroup>/<name>` with
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` at the same value where swap is accounted: no swap),
  and `<pids mount>/<our pids cgroup>/<name>` with `pids.max`;
- cgroup v2: beside our own cgroup, in its parent (v2 gives controllers only to the children of a cgroup without
  processes of its own: the parent must be delegated to us, or be the root), with `memory.max`,
  `memory.swap.max` = 0 and `pids.max`.

Not root, our own cgroup is not ours to write: sandboxes' cgroups go under one that root made and gave to the user
(delegated), named by `TRACEGYM_CGROUP` (a cgroup path as /proc/self/cgroup writes them), else found at the
conventional `/tracegym-<user name>`:

- cgroup v1: that path in both the memory and the pids hierarchies, owned by the user (root: `mkdir
  /sys/fs/cgroup/{memory,pids}/tracegym-alice && chown -R alice /sys/fs/cgroup/{memory,pids}/tracegym-alice`); a
  cgroup the user makes inside is the user's, files and all, and a process it starts may move itself in;
- cgroup v2: a subtree delegated to the user (systemd: `Delegate=yes`) that holds no process of its own, with this
  process inside it (the kernel lets a process be moved only by who may write the common ancestor of where it is
  and where it goes): e.g. `systemd-run --user -p Delegate=yes --slice=tracegym ...` and `TRACEGYM_CGROUP` naming
  the slice's parent; without the setting, our own cgroup's parent, as above.

Detection (`placement()`, once per process) says where, or why no cgroup can be made here (not root and nothing
delegated, the controllers missing); a sandbox then caps memory and processes per process only, and says so.

How a program enters it, with no race: the host opens each cgroup's entry file (a descriptor opened by root, or by
the owner of a delegated subtree, may move a process whoever writes it), and the program init's forked child
writes `0` (itself) to each before it drops privileges and execs the program: the program and everything it
starts are inside from their first instruction. The init stays outside (the caps are the program's alone), and the
descriptors are closed before the exec. A program cannot move itself out: every other cgroup's files belong to
root (or to us), and it runs under a uid that may not write them. The entry file is v1's `tasks` (the child is
single-threaded, so moving its thread moves it; `cgroup.procs` moves a thread group under a global lock whose
release waits an RCU grace period: 8-10 ms per run here, against 0.08 ms), and v2's `cgroup.procs` (which takes
that lock unless the hierarchy is mounted with `favordynmods`; not measured: this host has no v2 controllers).

What fired: an OOM kill in the cgroup (v1 `memory.oom_control`'s `oom_kill`, v2 `memory.events`) is the memory
cap; a fork it refused (`pids.events`' `max`) is the processes cap. Memory counts every page the sandbox's
processes charge, the files they write to a tmpfs included (the working directory, bubblewrap's /tmp: RAM is RAM).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import signal
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from tracegym.runtimes.processes import process_alive

CGROUP_PREFIX = "tracegym-sandbox-"
"""A sandbox's cgroup is `tracegym-sandbox-<sandbox id>`, the id starting with its owner's pid."""
CONTROLLERS = ("memory", "pids")
DELEGATED_SETTING = "TRACEGYM_CGROUP"
"""Environment variable naming the delegated cgroup sandboxes' cgroups go under (see the module); unset, not root:
`/tracegym-<user name>` where it exists."""
REMOVE_WITHIN_S = 5.0
"""How long removing a cgroup may wait for the processes it killed to be gone."""


@dataclass(frozen=True)
class Placement:
    """Where this process makes its sandboxes' cgroups: the folder of each (v2: one folder for both)."""

    version: Literal[1, 2]
    memory: Path
    pids: Path


@dataclass(frozen=True)
class Counts:
    """How often a sandbox's caps fired so far (they only grow)."""

    oom_kills: int = 0
    forks_refused: int = 0

    def fired_since(self, before: Counts) -> list[str]:
        """The limits (`ProgramResult.limit` names) that fired since `before`, memory first."""
        return [limit for limit, now, then in (("memory", self.oom_kills, before.oom_kills),
                                                ("processes", self.forks_refused, before.forks_refused))
                if now > then]


@dataclass(frozen=True)
class _Files:
    """The file names of one cgroup version."""

    memory_max: str
    swap_max: str
    """Memory and swap together (v1), or swap alone (v2); skipped where the kernel does not account swap."""
    oom: tuple[str, str]
    """The file and the key of the OOM-kill count."""
    memory_peak: str
    entry: str
    """The file a process writes `0` to to enter (see the module)."""


_FILES = {1: _Files("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", ("memory.oom_control", "oom_kill"),
                    "memory.max_usage_in_bytes", "tasks"),
          2: _Files("memory.max", "memory.swap.max", ("memory.events", "oom_kill"), "memory.peak", "cgroup.procs")}


class SandboxCgroup:
    """One sandbox's cgroup (see the module): its caps, the descriptors that move a process in, what fired, its
    members, and its removal."""

    def __init__(self, version: Literal[1, 2], memory: Path, pids: Path) -> None:
        self.version, self.memory, self.pids = version, memory, pids
        self._files = _FILES[version]
        self.caps: tuple[int, int] | None = None
        """The memory (MiB) and processes it is capped at now."""

    @classmethod
    def make(cls, where: Placement, sandbox_id: str, memory_mb: int, processes: int) -> SandboxCgroup:
        """A new cgroup for sandbox `sandbox_id`, capped; OSError when the host refuses (nothing is left)."""
        name = f"{CGROUP_PREFIX}{sandbox_id}"
        made = cls(where.version, where.memory / name, where.pids / name)
        try:
            for folder in made.folders:
                folder.mkdir()
            made.cap(memory_mb, processes)
        except OSError:
            made.remove()
            raise
        return made

    @property
    def folders(self) -> list[Path]:
        return list(dict.fromkeys((self.memory, self.pids)))

    def cap(self, memory_mb: int, processes: int) -> None:
        """Cap it at `memory_mb` (no swap) and `processes` tasks; OSError when the kernel refuses (v1: the memory
        its files already take is above the new cap)."""
        if self.caps == (memory_mb, processes):
            return
        limit = str(memory_mb << 20)
        memory = (self.memory / self._files.memory_max, limit)
        swap = (self.memory / self._files.swap_max, limit if self.version == 1 else "0")
        raising = self.caps is not None and memory_mb > self.caps[0]
        # v1 keeps memory+swap at or above memory alone: raise it first, lower it last
        for path, value in [swap, memory] if self.version == 1 and raising else [memory, swap]:
            try:
                path.write_text(value)
            except FileNotFoundError:
                if path != swap[0]:  # missing where the kernel does not account swap: swap is then not capped
                    raise
        (self.pids / "pids.max").write_text(str(processes))
        self.caps = (memory_mb, processes)

    def entry_files(self) -> list[Path]:
        """Its entry files (one per hierarchy): a single-threaded process that writes `0` to them enters it."""
        return [folder / self._files.entry for folder in self.folders]

    def entry_fds(self) -> list[int]:
        """Descriptors of each entry file (`entry_files`), open for writing (close-on-exec). The caller closes
        them."""
        fds: list[int] = []
        try:
            for path in self.entry_files():
                fds.append(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def counts(self) -> Counts:
        """How often its caps fired so far."""
        oom_file, oom_key = self._files.oom
        return Counts(_key(self.memory / oom_file, oom_key), _key(self.pids / "pids.events", "max"))

    def peak_bytes(self) -> int | None:
        """The most memory its processes held at once (None where the kernel does not say)."""
        try:
            return int((self.memory / self._files.memory_peak).read_text())
        except (OSError, ValueError):
            return None

    def members(self) -> list[int]:
        """The processes in it now."""
        pids: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                pids.update(int(pid) for pid in (folder / "cgroup.procs").read_text().split())
        return sorted(pids)

    def kill(self) -> list[int]:
        """SIGKILL every process in it; the pids signalled. (A killed process cannot fork; a child forked while
        the list was read is found by the next call: `remove` is called until it succeeds.)"""
        alive = [pid for pid in self.members() if process_alive(pid)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return alive

    def remove(self) -> bool:
        """Kill what is in it and remove it; False when a folder is still busy (a process not yet gone)."""
        self.kill()
        removed = True
        for folder in self.folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                removed = False
        return removed


def _key(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (`name value` lines); 0 when it is missing."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    return 0


# --- where this process makes them -------------------------------------------------------------------------
@functools.cache
def placement() -> Placement | str:
    """Where this process makes its sandboxes' cgroups, or why it cannot; decided once per process."""
    try:
        own, mounts = Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        return f"this host shows no cgroups ({exc})"
    return locate(own, mounts, os.environ.get(DELEGATED_SETTING) or None)


def conventional_delegated() -> str:
    """The cgroup path looked for, not root, when `TRACEGYM_CGROUP` is unset: `/tracegym-<user name>`."""
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = str(os.geteuid())
    return f"/tracegym-{name}"


def locate(own: str, mounts: str, delegated: str | None = None) -> Placement | str:
    """Where to make sandbox cgroups, given this process's `/proc/self/cgroup` and `/proc/self/mountinfo` and the
    delegated cgroup named (`TRACEGYM_CGROUP`): v1's memory and pids hierarchies when both are mounted, else v2's;
    or why neither can hold them."""
    paths = _own_paths(own)
    v1 = _v1_folders(mounts, paths)
    if v1 is not None:
        return _v1_placement(mounts, v1, delegated)
    v2 = _v2_folder(mounts, paths.get(""))
    if v2 is None:
        return "neither cgroup v1's memory and pids hierarchies nor a cgroup v2 holding this process is mounted"
    if delegated is not None:
        return _v2_delegated(mounts, v2, delegated)
    return _v2_placement(v2, at_root=paths.get("") == "/")


def _v1_placement(mounts: str, own: dict[str, Path], delegated: str | None) -> Placement | str:
    """Under the delegated cgroup when one is named, else under our own, else (not root) under the conventional
    delegated one where it exists."""
    if delegated is None:
        why = _unwritable([own["memory"], own["pids"]])
        if why is None or os.geteuid() == 0:
            return why or Placement(1, own["memory"], own["pids"])
        conventional = _v1_folders(mounts, dict.fromkeys(CONTROLLERS, conventional_delegated()))
        if conventional is None or not all(folder.is_dir() for folder in conventional.values()):
            return (f"{why}, and no cgroup is delegated to it: root may make one (mkdir and chown -R "
                    f"/sys/fs/cgroup/{{memory,pids}}{conventional_delegated()}), or name one in {DELEGATED_SETTING}")
        own = conventional
    else:
        named = _v1_folders(mounts, dict.fromkeys(CONTROLLERS, delegated))
        if named is None or not all(folder.is_dir() for folder in named.values()):
            return f"{DELEGATED_SETTING}={delegated}: no such cgroup in both the memory and pids hierarchies"
        own = named
    return _unwritable([own["memory"], own["pids"]]) or Placement(1, own["memory"], own["pids"])


def _v2_delegated(mounts: str, own: Path, delegated: str) -> Placement | str:
    """The delegated v2 cgroup named, which must hold this process below it (see the module)."""
    folder = _v2_folder(mounts, delegated)
    if folder is None or not folder.is_dir():
        return f"{DELEGATED_SETTING}={delegated}: no such cgroup v2"
    if not own.is_relative_to(folder) or own == folder:
        return (f"{DELEGATED_SETTING}={delegated}: this process runs in {own}, not in a cgroup below it (the kernel "
                f"moves a process only for who may write where it is and where it goes; and v2 gives controllers to "
                f"the children of a cgroup only while it holds no process): start tracegym in a child of it")
    return _v2_placement(folder, at_root=True)


def delegated_folders(path: str) -> list[Path]:
    """Where cgroup `path` (as /proc/self/cgroup writes them) is on this host: its folder in v1's memory and pids
    hierarchies, else in v2's; none where neither is mounted. What root makes and gives to a user (see the
    module)."""
    mounts = Path("/proc/self/mountinfo").read_text()
    v1 = _v1_folders(mounts, dict.fromkeys(CONTROLLERS, path))
    if v1 is not None:
        return list(v1.values())
    v2 = _v2_folder(mounts, path)
    return [] if v2 is None else [v2]


def _own_paths(own: str) -> dict[str, str]:
    """Our cgroup in each hierarchy: controller name (v2: '') -> path."""
    paths: dict[str, str] = {}
    for line in own.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _mounts(mounts: str, fstype: str) -> list[tuple[str, Path, list[str]]]:
    """(root inside the hierarchy, mount point, super options) of each `fstype` mount."""
    found = []
    for line in mounts.splitlines():
        before, _, after = line.partition(" - ")
        fields, rest = before.split(), after.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] == fstype:
            point = fields[4].replace("\\040", " ")
            found.append((fields[3], Path(point), rest[2].split(",")))
    return found


def _inside(root: str, point: Path, path: str) -> Path | None:
    """Where cgroup `path` is under a mount of the hierarchy's `root` at `point`; None when it does not show it."""
    relative = PurePosixPath(path).relative_to(root) if PurePosixPath(path).is_relative_to(root) else None
    return None if relative is None else point / relative


def _v1_folders(mounts: str, paths: dict[str, str]) -> dict[str, Path] | None:
    folders = {}
    for root, point, options in _mounts(mounts, "cgroup"):
        for controller in CONTROLLERS:
            if controller in options and controller in paths and controller not in folders:
                folder = _inside(root, point, paths[controller])
                if folder is not None:
                    folders[controller] = folder
    return folders if len(folders) == len(CONTROLLERS) else None


def _v2_folder(mounts: str, path: str | None) -> Path | None:
    if path is None:
        return None
    for root, point, _ in _mounts(mounts, "cgroup2"):
        folder = _inside(root, point, path)
        if folder is not None:
            return folder
    return None


def _v2_placement(own: Path, at_root: bool) -> Placement | str:
    """Our own cgroup at the root of the hierarchy (or the delegated one), else its parent, with memory and pids
    given to its children."""
    parent = own if at_root else own.parent
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return f"cgroup v2 at {parent} cannot be read: {exc}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"cgroup v2 at {parent} does not offer the {' and '.join(missing)} controller(s)"
    if any(c not in enabled for c in CONTROLLERS):
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as exc:
            return (f"cannot give memory and pids to the children of {parent} ({exc}); run tracegym in a leaf "
                    f"cgroup of a subtree delegated to it (e.g. systemd-run -p Delegate=yes)")
    return _unwritable([parent, parent / "cgroup.procs"]) or Placement(2, parent, parent)


def _unwritable(paths: list[Path]) -> str | None:
    for path in paths:
        if not os.access(path, os.W_OK):
            why = "" if os.geteuid() == 0 else " (not root)"
            return f"{path} is not writable by uid {os.geteuid()}{why}"
    return None


# --- what sandboxes leave behind ---------------------------------------------------------------------------
def make_cgroup(sandbox_id: str, memory_mb: int, processes: int) -> tuple[SandboxCgroup | None, str | None]:
    """The cgroup of sandbox `sandbox_id`, or None and why none could be made here."""
    where = placement()
    if isinstance(where, str):
        return None, where
    remove_abandoned_cgroups()
    try:
        return SandboxCgroup.make(where, sandbox_id, memory_mb, processes), None
    except OSError as exc:
        return None, f"making its cgroup failed: {exc}"


@functools.cache
def remove_abandoned_cgroups() -> list[Path]:
    """Remove the sandbox cgroups (in this process's placement) whose owner process is gone, killing what is
    still in them; the folders removed. Once per process, at its first sandbox."""
    where = placement()
    if isinstance(where, str):
        return []
    removed = []
    for parent in dict.fromkeys((where.memory, where.pids)):
        for folder in parent.glob(f"{CGROUP_PREFIX}*"):
            owner = folder.name.removeprefix(CGROUP_PREFIX).split("-", 1)[0]
            if owner.isdigit() and not process_alive(int(owner)):
                abandoned = SandboxCgroup(where.version, folder, folder)
                if _remove_within(abandoned):
                    removed.append(folder)
    return removed


def _remove_within(cgroup: SandboxCgroup) -> bool:
    """Remove `cgroup`, giving the processes it killed REMOVE_WITHIN_S to be gone."""
    deadline = time.monotonic() + REMOVE_WITHIN_S
    while not cgroup.remove():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
