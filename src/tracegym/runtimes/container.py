"""Container: the `container` runtime; programs run in a podman or docker container, when the host has an engine
that answers (detected by `ENGINE info`'s exit status: a docker client whose daemon is down says so), and the image
is in the engine's store (never pulled: `runtimes.container_image` builds the default one from Debian packages).

A sandbox's first run is one `ENGINE run --pull never` of the image, whose first process is tracegym's program
init (the image's `python3` runs it, as it runs in every runtime: rlimits, the uid drop, the forwarded proxy port,
the status report). From its second run on, the next run's container is made ahead, in the background, with the
same flags: `ENGINE create`, then (podman) `ENGINE init`, which makes its namespaces, mounts and cgroups and leaves
its first process waiting to exec; the next run with those flags writes its init's source and arguments to the
container's run folder (`BOOT_PRELUDE` reads them inside) and is one `ENGINE start`, about half of a whole `run`
at load (a run that arrives while its container is still being made waits for the rest; one with other limits or
another forwarded socket runs cold, and the one made ahead is removed at the close). A sandbox that runs one
program never makes one ahead.

The container has no network (`--network none`, a network namespace with only its loopback; with
`Limits.network` the host's network, as bubblewrap's `--share-net`), every capability dropped but the two the init
needs to drop to the sandbox's uid (SETUID, SETGID; gone at the drop), no_new_privs, a read-only root, the
sandbox's working directory bound at the same path and its /tmp, /var/tmp, /dev/shm and home bound from
subfolders of the sandbox's folder, the one tmpfs of `Limits.disk_mb` they all share with the working directory
(as root, mounted on the host; rootless podman, mounted in the user and mount namespaces of its pause process,
where it makes every container's mounts: `disk_holder`; elsewhere a private tmpfs of `disk_mb` each: see
`scratch_mounts`), the engine's memory cgroup (`memory_mb` for the whole run, no swap) and pids cgroup
(`processes` plus the init's own threads). Where the engine cannot cap (`engine_caps`: rootless podman on cgroup
v1 ignores `--memory` and `--pids-limit`, and says so on the run's stderr) those flags are not given and the
sandbox's own cgroup (`runtimes.cgroup`, under the user's delegated one) holds the program instead: its entry
files are bound in at CGROUP_MOUNT, each alone, and the init enters them before the exec. The init is the
container's pid 1: it reaps orphans, and its exit ends every process left.

The engine passes no descriptor on (docker cannot; podman's `--preserve-fds` only by number), so the init's status
report and its lifeline are files of the run's own folder beside the working directory, bound in at `RUN_MOUNT` and
closed to the program (mode 0700, root's; the program runs as the sandbox's uid): the init writes its report to
`status`, and reads the FIFO `lifeline`, whose one writer is this process: when it dies, even by SIGKILL, the init
reads EOF and ends the container (killing the engine's client would not: the engine keeps the container). A run
ends when its container does (not `--rm`: the engine's removal would hold it back, and count against its wall-clock
limit); one killed (wall limit, cancel) is removed at once, the others all at the sandbox's close in one engine
call, and those of a process that died before closing its sandboxes by the next process's first sandbox.

Tested here (podman 4.3 + runc, Debian 12, as root) by the escape battery, the sandbox contract and the escape
rollouts (tests/runtimes, slow), and tests/runtimes/test_container.py (no capabilities, network or writable root
in the container; the memory cap over the whole run; nothing left after a cancel, a close or a killed host; an
agent program reaching the proxy; a run in a container made ahead). Start to the program's first instruction:
see `benchmarks/container_start.py` and the README. crun (Debian's 1.8.1) refuses this host's cgroup layout
(cgroup v1 beside a cgroup2 hierarchy that holds a controller: "cgroups in hybrid mode not supported"), so runc
stays; installing it makes podman pick it by default. Docker is detected (fake engines in the tests, one answering
as docker's CLI does: there is no docker daemon here) and given the same command line (less podman's `rm -i -t 0`
and `init`) but has not run here. As an unprivileged user (rootless podman 4.3 + runc, fuse-overlayfs storage, the
image loaded from root's `podman save`, cgroup v1 with a cgroup delegated to the user) the hostile escape battery
passes every row (tests/runtimes/test_escape_battery_hostile.py, slow). There the sandbox has no uid of its own:
the init and the program are both the container's root, the user itself, so the program can read and rewrite its
own run's folder (its status report); and the tmpfs of a sandbox whose host process was killed before its close
stays mounted in podman's namespaces until the pause process ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracegym.runtimes.container_image import BUILD_HINT, IMAGE, image_present
from tracegym.runtimes.egress import EgressRoute
from tracegym.runtimes.process_sandbox import (
    MARKER,
    PROBE_TIMEOUT_S,
    Confinement,
    Launch,
    ProcessSandbox,
    _read_status,
)
from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.sandbox import Limits, RuntimeUnavailable
from tracegym.runtimes.workdir import capped_elsewhere, private_folders

ENGINES = ("podman", "docker")
"""Tried in this order; the first that answers is used."""
CLIENT_VARIABLES = ("PATH", "HOME", "TMPDIR", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "CONTAINER_HOST",
                    "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "XDG_RUNTIME_DIR",
                    "XDG_CONFIG_HOME")
"""The host's variables the engine's client runs with (its own: where its config, store and daemon are). Nothing
of the program's environment reaches the client: a root client told HOME or TMPDIR is the sandbox's working
directory would read config from it and write there."""
REMOVE = {"podman": ("rm", "-f", "-i", "-t", "0")}
"""How an engine removes containers at once, running or not, skipping any it does not have (podman's `rm -f` would
wait 10 s for SIGTERM first); else `rm -f`."""
LABEL = "tracegym.sandbox"
RUN_MOUNT = "/run/tracegym-init"
"""Where a run's own folder (the init's `status` report, its `lifeline` FIFO) is bound in the container."""
CGROUP_MOUNT = "/run/tracegym-cgroup"
"""Where the entry files of the sandbox's own cgroup are bound (`0`, `1`: one per hierarchy), where the engine
cannot cap the container (rootless podman on cgroup v1): the init enters them before it execs the program."""
CAPPING_CONTROLLERS = ("memory", "pids")
INIT_TASKS = 32
"""What the pids cgroup allows beyond `Limits.processes`: the init's own threads (its main one, the lifeline's,
the forwarder's and two per proxied connection)."""
INIT_PYTHON = "python3"
"""The interpreter that runs the program init in the container (the image's, found on the sandbox's PATH)."""


@functools.cache
def detect_engine() -> tuple[str | None, str]:
    """The first engine that answers (see `find_engine`); asked once per process."""
    return find_engine()


def find_engine(path: str | None = None) -> tuple[str | None, str]:
    """The first of ENGINES on `path` (default: PATH) whose `info` exits 0, as the path of its client; or None and
    why none does."""
    reasons = []
    for engine in ENGINES:
        client = shutil.which(engine, path=path)
        if client is None:
            reasons.append(f"{engine} is not installed")
            continue
        why = _no_answer(client)
        if why is None:
            return client, ""
        reasons.append(f"{engine} is installed but does not answer ({why})")
    return None, "; ".join(reasons)


def _no_answer(client: str) -> str | None:
    """Why `client info` failed (its last word on stderr, else stdout), or None when it exited 0."""
    try:
        done = subprocess.run([client, "info"], capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"info failed: {exc}"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip() or done.stdout.strip()).decode(errors="replace").splitlines()
    return f"{said[-1].strip() if said else 'no reason given'}; info exit status {done.returncode}"


@functools.cache
def engine_caps(engine: str) -> bool:
    """True when `engine` caps a container's memory and processes itself: as root, or a docker (its daemon's,
    root's), or a rootless podman given the memory and pids controllers (cgroup v2, delegated); not a rootless
    podman on cgroup v1, which ignores `--memory` and `--pids-limit` (and says so on the run's stderr)."""
    if os.geteuid() == 0 or Path(engine).name != "podman":
        return True
    with contextlib.suppress(OSError, subprocess.TimeoutExpired, ValueError):
        done = subprocess.run([engine, "info", "--format", "{{json .Host.CgroupControllers}}"], capture_output=True,
                              timeout=PROBE_TIMEOUT_S, text=True)
        return done.returncode == 0 and set(CAPPING_CONTROLLERS) <= set(json.loads(done.stdout or "[]"))
    return False


def pause_process(engine: str) -> int | None:
    """The pid of a rootless podman's pause process (which holds its user and mount namespaces between commands),
    made by a `podman unshare` where there is none yet; None when it cannot be found."""
    pid_file = _pause_file(engine)
    for attempt in range(2):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text()) if pid_file else 0
            if pid and process_alive(pid):
                return pid
        if attempt == 0:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([engine, "unshare", "true"], capture_output=True, timeout=PROBE_TIMEOUT_S)
    return None


@functools.cache
def _pause_file(engine: str) -> Path | None:
    """Where a rootless podman writes its pause process's pid: `libpod/tmp/pause.pid` beside its run root."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run([engine, "info", "--format", "{{.Store.RunRoot}}"], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip()).parent / "libpod" / "tmp" / "pause.pid"
    return None


@dataclass
class _RunFiles:
    """One run's folder on the host (bound in at RUN_MOUNT) and our end of its lifeline FIFO."""

    folder: Path
    lifeline: int


@dataclass
class _Prepared:
    """A container created ahead for a sandbox's next run (see `ContainerConfinement.wrap`): its name, its run
    folder, the flags it was created with, and the engine's `create` (done when `poll()` says so)."""

    name: str
    files: _RunFiles
    flags: list[str]
    creating: subprocess.Popen[bytes]


class ContainerConfinement(Confinement):
    """`ENGINE run` of one image per run, the program init its first process; or, from a sandbox's second run on,
    `ENGINE start` of a container created ahead for it (`ahead`)."""

    private_tmp = True
    init_on_host = False

    def __init__(self, engine: str, image: str, *, ahead: bool = True, caps: bool = True) -> None:
        self.engine, self.image, self.ahead = engine, image, ahead
        self.sandbox_cgroup = not caps
        """`caps`: the engine's own cgroup holds the container (`--memory`, `--pids-limit`); else (rootless podman
        on cgroup v1) the sandbox's cgroup of ours, which the init enters from inside (`cgroup_entries`)."""
        self.kind = Path(engine).name
        """The engine's name (`podman`, `docker`): which of its flags apply."""
        self._runs: dict[str, _RunFiles] = {}
        self._names: dict[str, str] = {}
        """Each run's container, by the run's marker."""
        self._started: list[str] = []
        """The containers of the sandbox's runs: the engine keeps each after its end, until the close."""
        self._wraps = 0
        self._prepared: _Prepared | None = None
        self._holder: int | None = None
        """The rootless engine's pause process, in whose namespaces the sandbox's tmpfs is mounted."""

    def disk_holder(self) -> int | None:
        """A rootless podman's pause process (its user and mount namespaces are where the engine makes every
        container's mounts), where it has one; None as root (the tmpfs is the host's) and for docker."""
        if os.geteuid() != 0 and self.kind == "podman":
            self._holder = pause_process(self.engine)
        return self._holder

    async def command(self, launch: Launch) -> list[str]:
        """`wrap(launch)`, after the container being prepared ahead with this run's flags is made (its remaining
        creation is shorter than a whole `run`)."""
        if self._holder is not None and not process_alive(self._holder):
            raise OSError(f"{self.kind}'s pause process {self._holder}, whose namespaces held the sandbox's capped "
                          f"folder, is gone (the engine was reset): open a new sandbox")
        prepared = self._prepared
        if prepared is not None and prepared.flags == self._flags(launch):
            await _made(prepared, kill=False)
        return self.wrap(launch)

    def wrap(self, launch: Launch) -> list[str]:
        """The engine's `start` of the container prepared ahead, when it is created and made with this run's flags;
        else its `run`. From the PREPARE_FROM-th run on, the next run's container is created ahead, in the
        background (most sandboxes run one program: they never pay for a container they do not use)."""
        flags = self._flags(launch)
        self._wraps += 1
        prepared = self._take(flags)
        if prepared is not None:
            files, name = prepared.files, prepared.name
            _write_run(files.folder, launch, ahead=True)
            command = [self.engine, "start", "-a", "-i", name]
        else:
            files, name = self._open_run(launch), container_name(launch.marker)
            command = [self.engine, "run", *self._identity(name, launch), *flags, "-v", f"{files.folder}:{RUN_MOUNT}",
                       self.image, *container_init(launch.init, len(launch.cgroup))]
        self._runs[launch.marker], self._names[launch.marker] = files, name
        self._started.append(name)
        if self.ahead and self._wraps >= PREPARE_FROM and self._prepared is None:
            self._prepare(flags, launch)
        return command

    def _identity(self, name: str, launch: Launch) -> list[str]:
        """The flags that name a run's container and mark it as the sandbox's."""
        return ["-i", "--pull", "never", "--name", name, "--label", f"{LABEL}={launch.marker.split('/')[0]}"]

    def _flags(self, launch: Launch) -> list[str]:
        """The container's confinement for `launch` (all but its name and run folder)."""
        limits = launch.limits
        memory, processes = f"{limits.memory_mb}m", str(limits.processes + INIT_TASKS)
        caps = [] if self.sandbox_cgroup else ["--memory", memory, "--memory-swap", memory, "--pids-limit", processes]
        flags = ["--log-driver", "none", "--network", "host" if limits.network else "none",
                 "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID",
                 "--security-opt", "no-new-privileges", "--read-only", *scratch_mounts(launch), *caps,
                 *ulimits(launch), *cgroup_entries(launch), "-v", f"{launch.workdir}:{launch.workdir}"]
        if launch.forward is not None:  # the init carries the loopback port to this socket: the host's, read-only
            folder = str(launch.forward.socket.parent)
            flags += ["-v", f"{folder}:{folder}:ro"]
        return flags + egress_flags(launch.egress)

    def egress_setup(self, route: EgressRoute, uid: int | None) -> list[str]:
        return []  # the hosts file is bound by the engine (egress_flags)

    def _take(self, flags: list[str]) -> _Prepared | None:
        """The prepared container, when its creation is done and it has `flags`; one that failed or has others
        is let go (removed at the close); one still being created is kept for a later run."""
        prepared = self._prepared
        if prepared is None or prepared.creating.poll() is None:
            return None
        self._prepared = None
        if prepared.creating.returncode == 0 and prepared.flags == flags:
            return prepared
        self._drop(prepared)
        return None

    def _prepare(self, flags: list[str], launch: Launch) -> None:
        """Start creating the next run's container, with `flags` and a run folder of its own, and (podman) its
        `init`: the engine's runtime makes its namespaces, mounts and cgroups and leaves its first process waiting
        to exec, so a `start` has only that exec left. Its command is the program init through BOOT_PRELUDE (the
        run's arguments are written to its folder when a run takes it)."""
        files = self._new_folder(launch.workdir.parent, f"p{self._wraps}")
        name = f"tracegym-{launch.marker.split('/')[0]}-p{self._wraps}"
        create = [*self._identity(name, launch), *flags, "-v", f"{files.folder}:{RUN_MOUNT}", self.image,
                  INIT_PYTHON, "-I", "-S", "-c", BOOT_PRELUDE]
        then_init = ' && exec "$0" init "$name"' if self.kind == "podman" else ""  # docker has no `init`
        command = ["sh", "-c", f'name=$1; shift; "$0" create "$@"{then_init}', self.engine, name, *create]
        environment = {k: os.environ[k] for k in CLIENT_VARIABLES if k in os.environ}
        try:
            creating = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=environment, start_new_session=True)
        except OSError:
            self._close_files(files)
            return
        self._prepared = _Prepared(name, files, flags, creating)

    def _drop(self, prepared: _Prepared) -> None:
        """Let a prepared container go: its folder now, the container itself at the close."""
        self._close_files(prepared.files)
        self._started.append(prepared.name)

    def _open_run(self, launch: Launch) -> _RunFiles:
        """The run's folder and its files (see `_new_folder`), the run's environment written in it."""
        files = self._new_folder(launch.workdir.parent, launch.marker.strip("/").split("/")[-1])
        _write_run(files.folder, launch)
        return files

    def _new_folder(self, sandbox: Path, run: str) -> _RunFiles:
        """A run's folder (ours, 0700; beside the sandbox's folder, whose disk the program may fill, and named
        after it, so a dead owner's is swept as its sandbox folders are), its lifeline FIFO made and held open by
        us (read and write: the init's read end opens at once, and reads EOF only when we are gone)."""
        folder = sandbox.with_name(f"{sandbox.name}-run-{run}")
        folder.mkdir(mode=0o700)
        os.mkfifo(folder / "lifeline", 0o600)
        return _RunFiles(folder, os.open(folder / "lifeline", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))

    @staticmethod
    def _close_files(files: _RunFiles) -> None:
        os.close(files.lifeline)
        shutil.rmtree(files.folder, ignore_errors=True)

    def _close_run(self, marker: str) -> dict[str, Any] | None:
        """The init's report of run `marker` (None when it wrote none); its folder removed and its lifeline let go
        (which ends the container, if it still runs)."""
        files = self._runs.pop(marker, None)
        if files is None:
            return None
        report = None
        with contextlib.suppress(OSError):
            fd = os.open(files.folder / "status", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                report = _read_status(fd)
            finally:
                os.close(fd)
        self._close_files(files)
        return report

    def spawn_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The client's own variables, and the run's marker (the sweep finds the client by it)."""
        return {**{k: os.environ[k] for k in CLIENT_VARIABLES if k in os.environ}, MARKER: env[MARKER]}

    def exit_status(self, returncode: int | None, marker: str) -> dict[str, Any] | None:
        report = self._close_run(marker)
        if report is not None:
            return report
        if returncode in (125, 126, 127):  # the engine's own: the init never ran
            why = {125: f"{self.kind} could not run the container (see its stderr)",
                   126: f"the image {self.image!r} cannot execute {INIT_PYTHON}",
                   127: f"the image {self.image!r} has no {INIT_PYTHON} to run the program init"}[returncode]
            return {"start_error": f"{why} ({self.kind} exit status {returncode})"}
        return None

    async def reap(self, marker: str) -> None:
        self._close_run(marker)  # its lifeline let go: the init ends the container from inside
        await self._engine(*REMOVE.get(self.kind, ("rm", "-f")), self._names.get(marker, container_name(marker)))

    async def release(self, sandbox_id: str) -> None:
        """Every container of the sandbox removed (in one engine call: not `run --rm`, whose removal would hold
        each run's end back by the engine's teardown, and count against its wall-clock limit)."""
        for marker in list(self._runs):
            self._close_run(marker)
        prepared, self._prepared = self._prepared, None
        if prepared is not None:  # its creation finishes first (else the engine could make it after the removal)
            await _made(prepared, kill=True)
            self._drop(prepared)
        started, self._started = self._started, []
        if started:
            await self._engine(*REMOVE.get(self.kind, ("rm", "-f")), *started)

    async def _engine(self, *args: str) -> str:
        return await engine_command(self.engine, *args)


async def _made(prepared: _Prepared, *, kill: bool) -> None:
    """Wait until `prepared`'s creation is done, at most PREPARE_TIMEOUT_S; past it, `kill` ends it (its whole
    process group), else it is left running (the run that waited starts cold)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.to_thread(prepared.creating.wait), PREPARE_TIMEOUT_S)
        return
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(prepared.creating.pid, signal.SIGKILL)
        await asyncio.to_thread(prepared.creating.wait)


async def engine_command(engine: str, *args: str) -> str:
    """Run one engine command to its end; its stdout ('' when it failed: cleanup is best effort)."""
    with contextlib.suppress(OSError):
        proc = await asyncio.create_subprocess_exec(engine, *args, stdout=subprocess.PIPE,
                                                    stderr=subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return out.decode() if proc.returncode == 0 else ""
    return ""


_SWEPT: set[str] = set()
"""The engines whose abandoned containers this process removed (once each)."""


async def remove_abandoned_containers(engine: str) -> list[str]:
    """Remove the sandbox containers whose owner process is gone (killed before its sandboxes closed: each
    container's init ended it, the engine keeps its record); the ones removed. Once per process and engine, at
    its first sandbox."""
    if engine in _SWEPT:
        return []
    _SWEPT.add(engine)
    listed = await engine_command(engine, "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}")
    abandoned = [name for name in listed.split() if owner_of(name) and not process_alive(owner_of(name))]
    if abandoned:
        await engine_command(engine, *REMOVE.get(Path(engine).name, ("rm", "-f")), *abandoned)
    return abandoned


def owner_of(name: str) -> int:
    """The pid of the process whose sandbox started container `name` (`tracegym-<pid>-<random>-<run>`); 0 when the
    name is not one of ours."""
    owner = name.removeprefix("tracegym-").split("-", 1)[0]
    return int(owner) if name.startswith("tracegym-") and owner.isdigit() else 0


ENVIRON_PRELUDE = (f"import os\nos.environb.clear()\nos.environb.update(v.split(b'=', 1) for v in "
                   f"open('{RUN_MOUNT}/environ', 'rb').read().split(b'\\0') if v)\n")
"""Put before the program init's source in a container: its environment (the program's) read from the run's
folder, in place of the engine's defaults (the values never pass through the engine's client or its command
line; an env file could not hold a newline)."""


BOOT_PRELUDE = ENVIRON_PRELUDE + (f"import sys\n_tg_init = open('{RUN_MOUNT}/argv', 'rb').read().split(b'\\0')\n"
                                  "sys.argv = ['-c', *map(os.fsdecode, _tg_init[1:])]\n"
                                  "exec(compile(_tg_init[0], '<init>', 'exec'))\n")
"""The command of a container created ahead: the environment prelude, then the program init's source and
arguments read from the run's folder (`argv`: NUL-separated, as `container_init` would have put them on the
command line), written when a run takes the container."""
PREPARE_TIMEOUT_S = 60.0
"""The longest a run, or the sandbox's close, waits for a container being made ahead (a hung engine: the run
starts cold, the close kills its making)."""
PREPARE_FROM = 2
"""The run of a sandbox from which the next run's container is created ahead (at this run's start)."""


def _write_run(folder: Path, launch: Launch, *, ahead: bool = False) -> None:
    """The run's environment (`environ`) and, for a container created ahead, the init's source and arguments
    (`argv`), written to its folder: read by the preludes inside, never on the engine's command line."""
    (folder / "environ").write_bytes(b"".join(f"{name}={value}\0".encode() for name, value in launch.env.items()))
    if ahead:
        init = [launch.init[4], *container_init(launch.init, len(launch.cgroup))[5:]]
        (folder / "argv").write_bytes(b"\0".join(os.fsencode(arg) for arg in init))


def container_init(init: list[str], cgroup_files: int = 0) -> list[str]:
    """The program init's command as the container runs it: the image's interpreter, the environment prelude,
    and the run's files at RUN_MOUNT for its STATUS and LIFELINE (and, with a cgroup of ours, its `cgroup_files`
    entry files at CGROUP_MOUNT for CGROUP_FDS) in place of the descriptors' numbers it is given on the host (see
    `runtimes.program_init` for the layout: `python -I -S -c SOURCE STATUS LIFELINE UID CWD NETWORK CGROUP_FDS
    ...`)."""
    entries = ",".join(f"{CGROUP_MOUNT}/{i}" for i in range(cgroup_files)) or "-"
    return [INIT_PYTHON, *init[1:4], ENVIRON_PRELUDE + init[4], f"{RUN_MOUNT}/status", f"{RUN_MOUNT}/lifeline",
            *init[7:10], entries, *init[11:]]


def cgroup_entries(launch: Launch) -> list[str]:
    """The entry files of the sandbox's own cgroup, each bound alone (the program sees no other file of it: not
    its caps) at CGROUP_MOUNT (none where the engine caps the container)."""
    return [flag for i, path in enumerate(launch.cgroup) for flag in ("-v", f"{path}:{CGROUP_MOUNT}/{i}")]


def scratch_mounts(launch: Launch) -> list[str]:
    """The container's /tmp, /var/tmp, /dev/shm and home: where the sandbox's folder is one tmpfs capped at
    `disk_mb` (as root), its subfolders bound there, so they and the working directory share that one cap, and
    what the program leaves there is the host's to read and goes with the folder; else (no tmpfs of ours) a
    private tmpfs of `disk_mb` each."""
    if not os.path.ismount(launch.workdir.parent) and not capped_elsewhere(launch.workdir.parent):
        size = launch.limits.disk_mb
        return ["--tmpfs", f"/tmp:size={size}m", "--tmpfs", f"/var/tmp:size={size}m", "--shm-size", f"{size}m"]
    binds = [flag for inside, source in private_folders(launch.workdir)
             for flag in ("-v", f"{source}:{inside}:nosuid,nodev")]
    return ["--ipc", "private", *binds]  # an IPC namespace of its own, without the engine's /dev/shm mount


def egress_flags(route: EgressRoute | None) -> list[str]:
    """Under an egress allow-list: the init (the container's root, until its program drops to the sandbox's uid
    and with it every capability) may add the allowed addresses to its loopback (NET_ADMIN) and listen on their
    ports (NET_BIND_SERVICE, for ports below 1024); each relay socket is bound in by itself (their folder is the
    sandbox uid's, 0700, which the init, holding no DAC_OVERRIDE, could not pass), and the hosts file over
    /etc/hosts."""
    if route is None:
        return []
    flags = ["--cap-add", "NET_ADMIN", "--cap-add", "NET_BIND_SERVICE"]
    for _, socket in route.destinations:
        flags += ["-v", f"{socket}:{socket}:ro"]
    return flags + ([] if route.hosts is None else ["-v", f"{route.hosts}:/etc/hosts:ro"])


def ulimits(launch: Launch) -> list[str]:
    """The container's open-file and process rlimits: those of `launch`'s program, which the init sets again
    (it cannot raise them, holding no CAP_SYS_RESOURCE). Given as root because an engine's defaults for these two
    there (podman's: a million) are past what a host without CAP_SYS_RESOURCE may set: the container would not
    start."""
    if os.geteuid() != 0:  # rootless: the engine's defaults are our own limits, which the init may lower
        return []
    limits = launch.limits
    files, processes = limits.open_files, limits.processes + INIT_TASKS
    return ["--ulimit", f"nofile={files}:{files}", "--ulimit", f"nproc={processes}:{processes}"]


def container_name(marker: str) -> str:
    """The container of the run marked `marker` (`<sandbox id>/<run>/`)."""
    return "tracegym-" + marker.strip("/").replace("/", "-")


class Container:
    """The `container` runtime (podman or docker, whichever answers first) running `image`."""

    name = "container"

    def __init__(self, limits: Limits | None = None, *, image: str = IMAGE, ahead: bool = True) -> None:
        self.limits, self.image, self.ahead = limits or Limits(), image, ahead
        """`ahead`: from a sandbox's second run on, its next run's container is created ahead (see
        `ContainerConfinement.wrap`)."""

    def unavailable(self) -> str | None:
        engine, why = detect_engine()
        if engine is None:
            return why
        return None if has_image(engine, self.image) else missing_image(engine, self.image)

    async def open(self) -> ProcessSandbox:
        reason = self.unavailable()
        if reason:
            raise RuntimeUnavailable(f"runtime {self.name!r} is unavailable on this host: {reason}")
        engine, _ = detect_engine()
        assert engine is not None
        await remove_abandoned_containers(engine)
        return ProcessSandbox(ContainerConfinement(engine, self.image, ahead=self.ahead, caps=engine_caps(engine)),
                              self.limits)


_HAVE: set[tuple[str, str]] = set()
"""The (engine, image) pairs found in the store (only presence is remembered: an image built later is found)."""


def has_image(engine: str, image: str) -> bool:
    if (engine, image) not in _HAVE and image_present(engine, image):
        _HAVE.add((engine, image))
    return (engine, image) in _HAVE


def missing_image(engine: str, image: str) -> str:
    """Why a run cannot start: `image` is not in the store, and tracegym never pulls one."""
    how = BUILD_HINT if image == IMAGE else f"pull or build it yourself ({Path(engine).name} pull {image})"
    return (f"the image {image!r} is not in {Path(engine).name}'s store and tracegym never pulls one: {how}, or "
            f"name an image you have (Container(image=...))")
