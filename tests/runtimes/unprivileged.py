"""Unprivileged: the test user the escape battery runs its non-root rows as. Root makes it for the session (a
home with a 0600 secret, a supplementary group owning a listening socket and a file), runs each row as it
(`escape_rows`' command line under `setpriv`, with tracegym importable by it), finds and removes what each row
left behind (the user's processes, its files in /tmp, /var/tmp and /dev/shm), and at the end deletes the user,
its home and its group. As an admin would (see `runtimes.cgroup`), root delegates a cgroup to the user at the
conventional `/tracegym-<user name>` (cgroup v1: in the memory and pids hierarchies), so its sandboxes cap memory
and processes per sandbox; `without_delegation` takes it away for a test. For the container runtime it sets the
user up for rootless podman as an admin would (`give_container_image`: subordinate ids, fuse-overlayfs storage, an
XDG_RUNTIME_DIR in its home, root's image loaded into its store); podman's own pause process and lock file are the
engine's, not a row's leftovers, but a sandbox tmpfs left mounted in its namespaces is one. Rows are served by one
process of the user's for the session (restarted when a row kills it: that is an escape), so each costs no
interpreter start."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from escape_rows import Props, Verdict, listening_socket
from runtime_helpers import wait_until

import tracegym
from tracegym.runtimes.cgroup import SandboxCgroup, delegated_folders
from tracegym.runtimes.process_sandbox import SANDBOX_PATH, SCRATCH

HERE = Path(__file__).parent
RUNNER_FILES = ("escape_rows.py", "runtime_helpers.py", "reward_hack.py")
"""What of tests/runtimes the user's runner imports."""
RUNNER_TIMEOUT_S = 120.0
"""The longest one row may take as the user."""
GROUP_FOLDER = Path("/var/lib")
RUNTIME_DIR = ".run"
"""The user's XDG_RUNTIME_DIR, in its home."""
SUBIDS = 65536
"""How many subordinate uids and gids the user's rootless podman maps (useradd's default count)."""
"""Where the group's socket and file go: a system folder, as a docker socket's would be (not a scratch folder)."""


@dataclass
class TestUser:
    """A user made for the session, and how to run a row as it."""

    __test__ = False  # not a test class, whatever its name
    name: str
    uid: int
    gid: int
    home: Path
    group: str
    props: Props
    """The session's props plus this user's: its home secret, its group's socket and file."""
    python: str = ""
    """An interpreter it may run that imports tracegym and the rows (found by `find_python`)."""
    pythonpath: str = ""
    runner: Path = HERE / "escape_rows.py"
    made: list[Path] = field(default_factory=list)
    """What was made for it outside its home (removed with it)."""
    sockets: list[socket.socket] = field(default_factory=list)
    runner_proc: subprocess.Popen[bytes] | None = None
    """The process serving rows as this user (`escape_rows`' command line), restarted when a row killed it."""
    log: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) /
                      f"tg-battery-runner-{secrets.token_hex(4)}.log")
    """The runner's stderr (root's file)."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """Runtimes this user cannot run, and why."""
    cgroups: list[Path] = field(default_factory=list)
    """The cgroup folders delegated to it (v1: its memory and pids folders)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """What its runner's environment adds (a `TRACEGYM_CGROUP`)."""
    engine_pause: Path | None = None
    """Where its rootless podman writes the pid of its pause process (the engine's own, which holds the user's
    namespace between podman calls: not a sandbox's leftover)."""

    def command(self, argv: list[str]) -> list[str]:
        """`argv` as this user, with its groups (the supplementary one included) and nothing of ours."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", "--", *argv]

    def environment(self) -> dict[str, str]:
        """Its login's environment: XDG_RUNTIME_DIR in its home (a login manager's /run/user/UID), where its
        rootless podman keeps its run state, not in /tmp."""
        return {"PATH": SANDBOX_PATH, "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                "LANG": "C.UTF-8", "PYTHONPATH": self.pythonpath, "PYTHONDONTWRITEBYTECODE": "1",
                "XDG_RUNTIME_DIR": str(self.home / RUNTIME_DIR), **self.extra_env}

    def restart_runner(self) -> None:
        """End the runner: the next row starts a new one (with the environment as it is then)."""
        if self.runner_proc is not None:
            self.runner_proc.kill()
            self.runner_proc.wait()
            self.runner_proc = None

    @contextlib.contextmanager
    def without_delegation(self) -> Iterator[None]:
        """Rows run meanwhile by a runner that looks for its delegated cgroup where there is none."""
        self.restart_runner()
        self.extra_env = {"TRACEGYM_CGROUP": f"/tg-battery-undelegated-{secrets.token_hex(4)}"}
        try:
            yield
        finally:
            self.extra_env = {}
            self.restart_runner()

    async def run_row(self, row: str, runtime_id: str) -> Verdict:
        """Row `row` under `runtime_id` as this user, plus what it left behind (found here, then removed). A
        runtime found unavailable to it is not asked again."""
        if runtime_id in self.unavailable:
            return Verdict(skipped=self.unavailable[runtime_id])
        verdict = await asyncio.to_thread(self._ask, row, runtime_id)
        if verdict.skipped:
            self.unavailable[runtime_id] = verdict.skipped
        verdict.leftovers += self.sweep()
        return verdict

    def _ask(self, row: str, runtime_id: str) -> Verdict:
        """The runner's verdict on one row (the runner started first where none is alive); a runner killed before
        it says one is itself an escape: a program killed a host process of its own user."""
        if self.runner_proc is None or self.runner_proc.poll() is not None:
            with open(self.log, "ab") as log:
                self.runner_proc = subprocess.Popen(
                    self.command([self.python, str(self.runner), self.props.to_json()]), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, env=self.environment(), cwd=self.home)
        proc = self.runner_proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{row} {runtime_id}\n".encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = read_line(proc.stdout.fileno(), RUNNER_TIMEOUT_S)
        if line.startswith("VERDICT "):
            return Verdict.from_json(line.removeprefix("VERDICT "))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.returncode is not None and proc.returncode < 0:
            return Verdict(escapes=[f"the host process running the sandbox (the same user's) died by signal "
                                    f"{-proc.returncode} mid-row"])
        proc.kill()
        proc.wait()
        said = self.log.read_text(errors="replace")[-3000:]
        return Verdict(broken=f"the runner said no verdict (exit status {proc.returncode}); its stderr ends: {said}")

    def processes(self, *, engine: bool = False) -> list[int]:
        """The user's live processes but its runner (and but its podman's pause process, unless `engine`)."""
        runner = self.runner_proc.pid if self.runner_proc and self.runner_proc.poll() is None else None
        pause = None if engine else self.pause_pid()
        return [pid for pid in processes_of(self.uid) if pid not in (runner, pause)]

    def pause_pid(self) -> int | None:
        """The pid of its rootless podman's pause process, when it has one."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.engine_pause.read_text()) if self.engine_pause else None
        return None

    def sweep(self, *, engine: bool = False) -> list[str]:
        """What of this user outlived its last row (processes but the runner and, unless `engine`, its podman's
        pause process; files in the scratch folders), each removed."""
        found: list[str] = []
        if not wait_until(lambda: not self.processes(engine=engine), 3):
            pids = self.processes(engine=engine)
            found += [f"process {pid} of the user alive after the row: {command_line(pid)}" for pid in pids]
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        pause = self.pause_pid()
        for point in held_mounts(pause) if pause else []:
            found.append(f"the sandbox tmpfs at {point} still mounted in the user's podman namespaces")
            subprocess.run(["nsenter", f"--target={pause}", "--mount", "umount", "--lazy", point], check=False)
        for path in files_of(self.uid):
            if path == self.engine_lock() and not engine:
                continue
            found.append(f"{path} of the user left after the row")
            remove(path)
        return found

    def engine_lock(self) -> Path | None:
        """The shared-memory lock of its rootless podman (the engine's own, for its life: not a sandbox's
        leftover), once it has used podman."""
        return Path(f"/dev/shm/libpod_rootless_lock_{self.uid}") if self.engine_pause else None


def held_mounts(pid: int) -> list[str]:
    """The sandbox tmpfs mounts in the mount namespace of process `pid` (a rootless podman's pause process)."""
    with contextlib.suppress(OSError):
        lines = Path(f"/proc/{pid}/mounts").read_text().splitlines()
        return [line.split()[1] for line in lines if line.split()[0] == "tracegym-sandbox"]
    return []


def read_line(fd: int, timeout_s: float) -> str:
    """One line from `fd` (read a byte at a time: nothing past it is taken), or what came before its end or
    `timeout_s`."""
    deadline, data = time.monotonic() + timeout_s, b""
    while not data.endswith(b"\n"):
        if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
            break
        byte = os.read(fd, 1)
        if not byte:
            break
        data += byte
    return data.decode(errors="replace").rstrip("\n")


def create_test_user(session: Props) -> TestUser:
    """A new user `tg-battery-<hex>` with a home and a supplementary group, and the props of its rows."""
    suffix = secrets.token_hex(4)
    name, group = f"tg-battery-{suffix}", f"tg-battery-g-{suffix}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    subprocess.run(["useradd", "--create-home", "--user-group", "--groups", group, "--shell", "/bin/sh", name],
                   check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    user = TestUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), group, session)
    runtime_dir = user.home / RUNTIME_DIR
    runtime_dir.mkdir(mode=0o700)
    os.chown(runtime_dir, user.uid, user.gid)
    secret = user.home / "secret.txt"
    secret.write_text(f"tg-battery-secret-{secrets.token_hex(8)}")
    os.chown(secret, user.uid, user.gid)
    secret.chmod(0o600)
    folder = Path(tempfile.mkdtemp(prefix="tg-battery-group-", dir=GROUP_FOLDER))
    folder.chmod(0o755)
    user.made.append(folder)
    group_gid = grp.getgrnam(group).gr_gid
    group_socket, group_file = folder / "engine.sock", folder / "engine.conf"
    user.sockets.append(listening_socket(group_socket, 0o660))
    group_file.write_text("tg-battery-secret-group-file")
    for path in (group_socket, group_file):
        os.chown(path, 0, group_gid)
        path.chmod(0o660)
    user.props = replace(session, home_secret=str(secret), group_socket=str(group_socket), group_file=str(group_file))
    delegate_cgroup(user)
    return user


def delegate_cgroup(user: TestUser) -> None:
    """Make `/tracegym-<user name>` in each cgroup hierarchy (v1: memory and pids) and give it to the user, as an
    admin would (see `runtimes.cgroup`); nothing where no cgroup is mounted."""
    for folder in delegated_folders(f"/tracegym-{user.name}"):
        folder.mkdir()
        user.cgroups.append(folder)
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(folder)], check=True)


def remove_cgroups(folders: list[Path]) -> None:
    """Remove delegated cgroups, with what was made and left in them."""
    for folder in folders:
        for child in [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []:
            SandboxCgroup(1, child, child).remove()
        with contextlib.suppress(OSError):
            folder.rmdir()


def delete_test_user(user: TestUser) -> None:
    """Kill what the user still runs, remove its files in the scratch folders, what was made for it, its home,
    itself and its group (each step tried whatever the others did)."""
    user.restart_runner()
    user.sweep(engine=True)
    remove_cgroups(user.cgroups)
    user.log.unlink(missing_ok=True)
    for server in user.sockets:
        server.close()
    for path in user.made:
        remove(path)
    subprocess.run(["userdel", "--remove", user.name], check=False, capture_output=True)
    subprocess.run(["groupdel", user.group], check=False, capture_output=True)
    remove(user.home)


def find_python(user: TestUser) -> str | None:
    """Make tracegym and the rows importable by `user` (a copy in a folder it can read when the checkout is not)
    and set the interpreter that runs them; None when done, else why it cannot be."""
    site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    source = str(Path(tracegym.__file__).parents[1])
    why = _try_pythons(user, [source, str(HERE), *site])
    if why is None:
        return None
    copy = Path(tempfile.mkdtemp(prefix="tg-battery-src-"))
    user.made.append(copy)
    shutil.copytree(Path(tracegym.__file__).parent, copy / "tracegym",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in RUNNER_FILES:
        shutil.copy(HERE / name, copy / name)
    subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
    user.runner = copy / "escape_rows.py"
    return _try_pythons(user, [str(copy), *site]) and f"{why}; from a readable copy too"


def _try_pythons(user: TestUser, pythonpath: list[str]) -> str | None:
    """Set the first interpreter `user` can import the rows with from `pythonpath`; None, else why none can."""
    user.pythonpath = os.pathsep.join(pythonpath)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = dict.fromkeys([shutil.which(version, path=SANDBOX_PATH) or "", sys.executable,
                                os.path.realpath(sys.executable), shutil.which(version) or ""])
    said = []
    for python in filter(None, candidates):
        done = subprocess.run(user.command([python, "-c", "import escape_rows"]), capture_output=True,
                              env=user.environment(), cwd=user.runner.parent, timeout=60, check=False)
        if done.returncode == 0:
            user.python = python
            return None
        said.append(f"{python}: {done.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    return f"the test user cannot import tracegym and the rows ({'; '.join(said)})"


def processes_of(uid: int) -> list[int]:
    """Live processes (not zombies) run by `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and entry.stat().st_uid == uid \
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def files_of(uid: int) -> list[Path]:
    """What `uid` owns at the top of the scratch folders."""
    found = []
    for folder in SCRATCH:
        with contextlib.suppress(OSError):
            found += [p for p in Path(folder).iterdir() if _owner(p) == uid]
    return found


def _owner(path: Path) -> int | None:
    try:
        return path.lstat().st_uid
    except OSError:
        return None


def remove(path: Path) -> None:
    """Remove a file or a folder tree, whatever is in it."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def give_container_image(user: TestUser, engine: str, image: str) -> str | None:
    """Set the user up for rootless podman as an admin would (subordinate ids, a store on fuse-overlayfs where
    installed, else podman's default) and load root's `image` into its store (`podman save` as root, `podman load`
    as the user: no registry); None when done, else why it cannot be."""
    if Path(engine).name != "podman":
        return f"the test user's container engine is rootless podman; root's engine is {engine}"
    add_subids(user.name)
    config = user.home / ".config" / "containers"
    if shutil.which("fuse-overlayfs"):
        config.mkdir(parents=True)
        (config / "storage.conf").write_text('[storage]\ndriver = "overlay"\n[storage.options.overlay]\n'
                                             'mount_program = "/usr/bin/fuse-overlayfs"\n')
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(user.home / ".config")], check=True)
    user.engine_pause = user.home / RUNTIME_DIR / "libpod" / "tmp" / "pause.pid"
    folder = Path(tempfile.mkdtemp(prefix="tg-battery-image-", dir="/var/tmp"))
    try:
        folder.chmod(0o755)
        archive = folder / "image.tar"
        saved = subprocess.run([engine, "save", "-q", "-o", str(archive), image], capture_output=True, text=True,
                               timeout=300, check=False)
        if saved.returncode != 0:
            return f"root's {engine} could not save {image}: {saved.stderr.strip()}"
        archive.chmod(0o644)
        loaded = subprocess.run(user.command([engine, "load", "-q", "-i", str(archive)]), capture_output=True,
                                text=True, env=user.environment(), cwd=user.home, timeout=300, check=False)
        if loaded.returncode != 0:
            return f"the test user's rootless podman could not load {image}: {loaded.stderr.strip()}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return None


def add_subids(name: str) -> None:
    """Give user `name` SUBIDS subordinate uids and gids after the last range handed out, where useradd did not
    (it does only where /etc/subuid exists)."""
    for kind, file in (("uids", Path("/etc/subuid")), ("gids", Path("/etc/subgid"))):
        ranges = [line.split(":") for line in (file.read_text().splitlines() if file.exists() else [])]
        if any(entry[0] == name for entry in ranges):
            continue
        start = max([100_000, *(int(entry[1]) + int(entry[2]) for entry in ranges if len(entry) == 3)])
        subprocess.run(["usermod", f"--add-sub{kind}", f"{start}-{start + SUBIDS - 1}", name], check=True,
                       capture_output=True)
