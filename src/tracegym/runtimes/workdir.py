"""Workdir: a sandbox's folder on the host (its working directory and its private /tmp, /var/tmp, /dev/shm and
home) and the host's reads and writes in the working directory, never following a link a program left there.

The host runs as root while a sandbox's program owns its working directory, so every host-side read or write in
it goes through here: the directory is `<temp>/tracegym-sandbox-<id>/work`, its parent ours and mode 0711 (the
program may pass through it but can neither rename nor replace `work`); each path is opened one component at a
time relative to the directory's descriptor with O_NOFOLLOW, a file is written by unlinking what is there and
creating it anew with O_EXCL (a symlink or hard link the program planted is replaced, never written through), and
a read takes only a regular file, up to a size cap (a FIFO cannot block us, /dev/zero cannot flood us).

Beside `work` the folder holds what a namespaced sandbox binds in place of the host's scratch folders (`tmp`,
`var-tmp`, `shm`, `home`: see `private_folders`) and `view`, where the subprocess runtime's init builds the
sandbox's root. Its files are capped at `Limits.disk_mb` all together, by one tmpfs: a program that fills its
working directory, /tmp, /var/tmp, /dev/shm and home together gets ENOSPC, not the host's disk.

- Root mounts the tmpfs over the whole folder on the host (the host reads what the program left; unmounted at
  removal, leftovers and all).
- Not root (no right to mount on the host), for a runtime whose programs start in namespaces of their own
  (bubblewrap, subprocess): a *keeper* process per sandbox holds a user and mount namespace of its own (`unshare
  --user --map-root-user --mount`), in which it mounts the tmpfs over the folder; it lives until the sandbox's
  removal (or its owner's death: it reads a pipe only we hold). Each run's wrapper starts inside the keeper's
  namespaces (`enter_disk`: `nsenter`, as the owner of its user namespace), so bwrap or `unshare` make the
  sandbox's own namespaces inside them and see the tmpfs at the folder's path. On the host, each of the folder's
  entries is a symlink to the same entry through the keeper's root (`/proc/<keeper>/root/<folder>/work`): the
  working directory has the same path inside and out, and the host reads and writes the tmpfs through it. The
  egress relay's folder (`egress`) stays the host's, bound by the keeper into its tmpfs (its sockets are made by
  the host).
- Not root, for a runtime whose mounts are made in another process's namespaces (rootless podman: its pause
  process's), the tmpfs is mounted there (`nsenter`, as the owner of its user namespace) and seen by the host the
  same way, through that process's root; it is unmounted there at removal.
- Elsewhere (not root, and no keeper: the process-group fallback, a host without unprivileged user namespaces) the
  folder is plain and uncapped, which the log says once, naming why.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import select
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

WORKDIR_PREFIX = "tracegym-sandbox-"
"""A sandbox's folder is `<temp>/tracegym-sandbox-<sandbox id>-<random>`, the id starting with the owner's pid;
its working directory is `work` inside."""
READ_CAP_BYTES = 16 << 20
"""Most bytes `read_file` returns unless told otherwise."""
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
"""The world-writable folders: where a sandbox without a mount namespace can leave files (what its uid left there
is removed at close); a namespaced sandbox has its own (`private_folders`)."""
_PRIVATE = dict(zip(SCRATCH, ("tmp", "var-tmp", "shm"), strict=True))
_SANDBOX_HOME = "home"
VIEW_ROOT = "view"
"""The folder, beside `work`, on which the subprocess runtime's init mounts the root it builds for the program."""
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 0x2, 0x4, 0x2


def make_workdir(sandbox_id: str, uid: int | None, disk_mb: int, namespaced: bool = False,
                 holder: int | None = None) -> tuple[Path, bool]:
    """A new sandbox folder and its working directory, owned by its `uid` (when given), inside a folder of ours
    it cannot rename or replace; and whether the folder is capped at `disk_mb` (one tmpfs: on the host where we are
    root, else in a keeper's namespaces where the runtime's programs start `namespaced`, or in those of the process
    `holder` whose mounts they see: see the module)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{sandbox_id}-"))
    os.chmod(folder, 0o711)
    why = _cap(folder, disk_mb, namespaced, holder)
    if why is not None:
        _warn_uncapped(disk_mb, why)
    inside = _KEEPERS[folder].root / folder.relative_to("/") if folder in _KEEPERS else folder
    for name, mode, owner in (("work", 0o700, uid), (_SANDBOX_HOME, 0o700, uid), (VIEW_ROOT, 0o700, None),
                              *((name, 0o1777, None) for name in _PRIVATE.values())):
        (inside / name).mkdir()
        os.chmod(inside / name, mode)  # after mkdir: the umask does not apply
        if owner is not None:
            os.chown(inside / name, owner, owner)
        if inside != folder:
            (folder / name).symlink_to(inside / name)
    workdir = folder / "work"
    for private, source in private_folders(workdir):  # the host paths bound in, where a private folder hides them
        for path in (workdir, folder / RELAY):
            if path.is_relative_to(private):
                (source / path.relative_to(private)).mkdir(mode=0o755, parents=True)
    return workdir, why is None


def _cap(folder: Path, disk_mb: int, namespaced: bool, holder: int | None = None) -> str | None:
    """Cap `folder` at `disk_mb` (see the module); None when it is, else why it cannot be."""
    if os.geteuid() == 0:
        return None if _mount_tmpfs(folder, disk_mb) else "mounting its tmpfs failed"
    if holder is not None:
        return _mount_in_holder(folder, disk_mb, holder)
    if namespaced:
        return _start_keeper(folder, disk_mb)
    return "its runtime starts no namespaces a tmpfs of ours could be mounted in (not root: no right to mount here)"


@dataclass
class _Keeper:
    """The process holding a sandbox folder's tmpfs in namespaces of its own (see the module); or, with no `proc`
    of ours, the process `pid` in whose namespaces we mounted it (a rootless container engine's)."""

    proc: subprocess.Popen[bytes] | None
    pid: int = 0
    folder: Path | None = None
    """The folder mounted over in the holder's namespaces (unmounted there at the end)."""

    @property
    def root(self) -> Path:
        """Its root (its mount namespace's), as the host reaches it."""
        return Path(f"/proc/{self.proc.pid if self.proc else self.pid}/root")

    def end(self) -> None:
        """Close its pipe (it exits, its namespaces and tmpfs go with it) and reap it; a holder's tmpfs is
        unmounted in its namespaces (lazily: what the program left goes with it)."""
        if self.proc is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([*_joining(self.pid), "umount", "--lazy", str(self.folder)], capture_output=True,
                               timeout=KEEPER_START_S)
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(KEEPER_START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_KEEPERS: dict[Path, _Keeper] = {}
"""Each sandbox folder's keeper, by the folder."""
KEEPER_START_S = 10.0
"""How long a keeper may take to say its tmpfs is mounted (and to exit when told)."""
_KEEPER_SCRIPT = ('exec 3<"$0/$2" && mount -t tmpfs -o "size=$1m,mode=0711,nosuid,nodev" tracegym-sandbox "$0" && '
                  'mkdir -m 0700 "$0/$2" && mount --no-canonicalize --bind /proc/self/fd/3 "$0/$2" && exec 3<&- && '
                  'echo ready && exec cat >/dev/null')
"""The keeper, root of its own user namespace: the host's relay folder kept open, the tmpfs mounted over the
sandbox folder, the relay folder bound in (by its descriptor, uncanonicalized: its path now leads into the
tmpfs), then it waits for its pipe's end."""


def _start_keeper(folder: Path, disk_mb: int) -> str | None:
    """Start the keeper of `folder` (its tmpfs mounted when this returns); None, else why it could not."""
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian/Ubuntu: util-linux), so no keeper can hold its tmpfs"
    (folder / RELAY).mkdir(mode=0o700)
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _KEEPER_SCRIPT, str(folder), str(disk_mb),
            RELAY]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return f"its keeper could not start: {exc}"
    assert proc.stdout is not None and proc.stderr is not None
    ready = select.select([proc.stdout], [], [], KEEPER_START_S)[0] and proc.stdout.readline() == b"ready\n"
    if not ready:
        keeper = _Keeper(proc)
        keeper.end()
        said = proc.stderr.read().decode(errors="replace").strip().splitlines()
        return f"its keeper could not mount a tmpfs in namespaces of its own: {said[-1] if said else proc.returncode}"
    proc.stdout.close()
    proc.stderr.close()
    _KEEPERS[folder] = _Keeper(proc)
    return None


def capped_elsewhere(folder: Path) -> bool:
    """True when `folder`'s tmpfs is in a keeper's or a holder's namespaces (the host sees its entries through
    symlinks)."""
    return folder in _KEEPERS


def enter_disk(folder: Path) -> list[str]:
    """The command prefix that starts a wrapper in the namespaces of `folder`'s keeper (as the owner of its user
    namespace, root in it); none where the folder has no keeper of ours (a holder's wrapper is the engine's client,
    which enters them itself)."""
    keeper = _KEEPERS.get(folder)
    if keeper is None or keeper.proc is None:
        return []
    return _joining(keeper.proc.pid)


def _joining(pid: int) -> list[str]:
    """The command prefix that runs a command in the user and mount namespaces of process `pid` (ours: we own its
    user namespace, and are root in it)."""
    return ["nsenter", f"--target={pid}", "--user", "--mount", "--preserve-credentials", "--"]


_HOLDER_SCRIPT = ('exec 3<"$0/$2" && mount -t tmpfs -o "size=$1m,mode=0711,nosuid,nodev" tracegym-sandbox "$0" && '
                  'mkdir -m 0700 "$0/$2" && mount --no-canonicalize --bind /proc/self/fd/3 "$0/$2"')
"""The keeper's mounts (`_KEEPER_SCRIPT`), made in a holder's namespaces, which outlive the script."""


def _mount_in_holder(folder: Path, disk_mb: int, holder: int) -> str | None:
    """Mount `folder`'s tmpfs in the user and mount namespaces of process `holder` (a rootless container engine's:
    its containers' bind mounts are made there); None, else why it could not be."""
    if shutil.which("nsenter") is None:
        return "nsenter is not installed (Debian/Ubuntu: util-linux): no tmpfs can be mounted where the engine sees it"
    (folder / RELAY).mkdir(mode=0o700)
    try:
        done = subprocess.run([*_joining(holder), "sh", "-c", _HOLDER_SCRIPT, str(folder), str(disk_mb), RELAY],
                              capture_output=True, timeout=KEEPER_START_S, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"mounting its tmpfs in the namespaces of process {holder} failed: {exc}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"mounting its tmpfs in the namespaces of process {holder} failed: {said}"
    _KEEPERS[folder] = _Keeper(None, holder, folder)
    return None


RELAY = "egress"
"""The sandbox folder's subfolder an egress allow-list's relay keeps its sockets in (see `runtimes.egress`)."""


def private_folders(workdir: Path) -> list[tuple[Path, Path]]:
    """What a namespaced sandbox sees in place of the host's /tmp, /var/tmp, /dev/shm and home: (the path
    inside, the folder of the sandbox's bound there), in the order they are bound."""
    folder = workdir.parent
    found = [(Path(inside), folder / name) for inside, name in _PRIVATE.items()]
    home = _host_home()
    return found if home is None else [*found, (home, folder / _SANDBOX_HOME)]


@functools.cache
def _host_home() -> Path | None:
    """The host user's home, when it is a folder of its own (not /)."""
    home = Path.home()
    return home if home != Path("/") and home.is_dir() else None


def _warn_uncapped(disk_mb: int, why: str) -> None:
    """Say once per process (per reason) that sandboxes' files are not capped, and why."""
    if why not in _SAID:
        _SAID.add(why)
        logging.getLogger(__name__).warning(
            "sandboxes' files (working directory, /tmp, /var/tmp, /dev/shm, home) are not capped by Limits.disk_mb "
            "(%d MB here): %s", disk_mb, why)


_SAID: set[str] = set()


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a tmpfs of `size_mb` on `path` (root's, mode 0711); False when the host does not let us."""
    options = f"size={size_mb}m,mode=0711".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mount(b"tracegym-sandbox", bytes(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0


def remove_workdir(folder: Path, onerror: Callable[..., Any] | None = None) -> None:
    """Remove a sandbox's folder (`<temp>/tracegym-sandbox-<id>-*`), unmounted first when it is a tmpfs of its own
    (or, as made by an older version, its working directory is)."""
    keeper = _KEEPERS.pop(folder, None)
    if keeper is not None:
        keeper.end()
    for mounted in (folder / "work", folder):
        if os.path.ismount(mounted):
            ctypes.CDLL(None, use_errno=True).umount2(bytes(mounted), _MNT_DETACH)
    shutil.rmtree(folder, onerror=onerror)


def relative_parts(name: str) -> tuple[str, ...]:
    """The components of `name`, a path inside a working directory; ValueError when it is absolute, empty or
    leaves the directory."""
    parts = PurePosixPath(name).parts
    if not parts or parts[0] == "/" or ".." in parts:
        raise ValueError(f"{name!r} must be a relative path inside the working directory")
    return parts


@contextlib.contextmanager
def _folder(workdir: Path, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """A descriptor of the folder `parts` names in `workdir`, each component opened without following a link;
    missing ones are made (owned as the working directory is) when `create`."""
    kept = workdir.parent in _KEEPERS  # then it is our symlink into the keeper's tmpfs (see the module)
    fd = os.open(workdir, _DIRECTORY & ~os.O_NOFOLLOW if kept else _DIRECTORY)
    try:
        owner = os.fstat(fd)
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            inner = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            if create and os.fstat(fd).st_uid != owner.st_uid:
                os.fchown(fd, owner.st_uid, owner.st_gid)
        yield fd
    finally:
        os.close(fd)


def write_file(workdir: Path, name: str, content: str | bytes) -> None:
    """Write `content` to `name` in `workdir` as a new regular file owned as the directory is; whatever was there
    (a symlink, a hard link) is unlinked first, never written through. ValueError for a path that leaves the
    directory; OSError when a component is not a real folder or the name is a folder."""
    *folders, base = relative_parts(name)
    data = content if isinstance(content, bytes) else content.encode()
    with _folder(workdir, tuple(folders), create=True) as dir_fd:
        owner = os.fstat(dir_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(base, dir_fd=dir_fd)
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as file:
            os.fchown(fd, owner.st_uid, owner.st_gid)
            file.write(data)


def read_file(workdir: Path, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
    """The first `cap` bytes of regular file `name` in `workdir`; None when there is none (missing, a symlink,
    a folder, a FIFO). ValueError for a path that leaves the directory."""
    *folders, base = relative_parts(name)
    try:
        with _folder(workdir, tuple(folders), create=False) as dir_fd:
            fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:  # missing, or a link where a folder or the file should be
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(cap)
