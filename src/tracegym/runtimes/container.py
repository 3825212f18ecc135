"""Container: the `container` runtime; programs run in a podman or docker container, when the host has an engine
that answers (detected by `ENGINE info`'s exit status: a docker client whose daemon is down says so), and the image
is in the engine's store (never pulled: `runtimes.container_image` builds the default one from Debian packages).

Each run is one `ENGINE run --pull never` of the image, whose first process is tracegym's program init (the
image's `python3` runs it, as it runs in every runtime: rlimits, the uid drop, the forwarded proxy port, the status
report). The container has no network (`--network none`, a network namespace with only its loopback; with
`Limits.network` the host's network, as bubblewrap's `--share-net`), every capability dropped but the two the init
needs to drop to the sandbox's uid (SETUID, SETGID; gone at the drop), no_new_privs, a read-only root, the
sandbox's working directory bound at the same path and, as root, its /tmp, /var/tmp, /dev/shm and home bound from
subfolders of the sandbox's folder, the one tmpfs of `Limits.disk_mb` they all share with the working directory
(not root: a private tmpfs of `disk_mb` each; see `scratch_mounts`), the engine's memory cgroup (`memory_mb` for
the whole run, no swap) and pids cgroup (`processes` plus the init's own threads). The init is the container's
pid 1: it reaps orphans, and its exit ends every process left.

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
agent program reaching the proxy). Start to the program's first instruction (`benchmarks/sandbox_start.py`, 2
cores at load average 9-11, shared with other jobs): 458 ms p50, 3.2 s p99, against bubblewrap's 89 ms p50 in the
same run; nearly all of it is podman's client (runc alone, from a prepared bundle: 70-150 ms at load 13). Docker
is detected (fake engines in the tests) and given the same command line (less podman's `rm -i -t 0`) but has not
run here. As non-root (rootless podman) the sandbox has no uid of its own: the init and the program share one, so
the program could reach the run's folder; untested.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracegym.runtimes.container_image import BUILD_HINT, IMAGE, image_present
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
from tracegym.runtimes.workdir import private_folders

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


@dataclass
class _RunFiles:
    """One run's folder on the host (bound in at RUN_MOUNT) and our end of its lifeline FIFO."""

    folder: Path
    lifeline: int


class ContainerConfinement(Confinement):
    """`ENGINE run` of one image per run, the program init its first process."""

    private_tmp = True
    sandbox_cgroup = False  # the engine's own cgroup holds the container: --memory, --pids-limit
    cannot_egress = ("the container's init has no right to add the allowed addresses to its loopback, and the "
                     "egress relay's sockets are not bound into it; use the bubblewrap runtime or the subprocess "
                     "runtime with namespaces")

    def __init__(self, engine: str, image: str) -> None:
        self.engine, self.image = engine, image
        self.kind = Path(engine).name
        """The engine's name (`podman`, `docker`): which of its flags apply."""
        self._runs: dict[str, _RunFiles] = {}
        self._started: list[str] = []
        """The containers of the sandbox's runs: the engine keeps each after its end, until the close."""

    def wrap(self, launch: Launch) -> list[str]:
        limits, sandbox_id = launch.limits, launch.marker.split("/")[0]
        files = self._open_run(launch)
        self._started.append(container_name(launch.marker))
        command = [self.engine, "run", "-i", "--pull", "never",
                   "--name", container_name(launch.marker), "--label", f"{LABEL}={sandbox_id}",
                   "--log-driver", "none", "--network", "host" if limits.network else "none",
                   "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID",
                   "--security-opt", "no-new-privileges", "--read-only", *scratch_mounts(launch),
                   "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
                   "--pids-limit", str(limits.processes + INIT_TASKS), *ulimits(launch),
                   "-v", f"{launch.workdir}:{launch.workdir}", "-v", f"{files.folder}:{RUN_MOUNT}"]
        if launch.forward is not None:  # the init carries the loopback port to this socket: the host's, read-only
            folder = str(launch.forward.socket.parent)
            command += ["-v", f"{folder}:{folder}:ro"]
        return [*command, self.image, *container_init(launch.init)]

    def _open_run(self, launch: Launch) -> _RunFiles:
        """The run's folder (ours, 0700; beside the sandbox's folder, whose disk the program may fill, and named
        after it, so a dead owner's is swept as its sandbox folders are), its lifeline FIFO made and held open by
        us (read and write: the init's read end opens at once, and reads EOF only when we are gone)."""
        sandbox = launch.workdir.parent
        folder = sandbox.with_name(f"{sandbox.name}-run-{launch.marker.strip('/').split('/')[-1]}")
        folder.mkdir(mode=0o700)
        os.mkfifo(folder / "lifeline", 0o600)
        environ = b"".join(f"{name}={value}\0".encode() for name, value in launch.env.items())
        (folder / "environ").write_bytes(environ)
        files = _RunFiles(folder, os.open(folder / "lifeline", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
        self._runs[launch.marker] = files
        return files

    def _close_run(self, marker: str) -> dict[str, Any] | None:
        """The init's report of run `marker` (None when it wrote none); its folder removed and its lifeline let go
        (which ends the container, if it still runs)."""
        files = self._runs.pop(marker, None)
        if files is None:
            return None
        os.close(files.lifeline)
        report = None
        with contextlib.suppress(OSError):
            fd = os.open(files.folder / "status", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                report = _read_status(fd)
            finally:
                os.close(fd)
        shutil.rmtree(files.folder, ignore_errors=True)
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
        await self._engine(*REMOVE.get(self.kind, ("rm", "-f")), container_name(marker))

    async def release(self, sandbox_id: str) -> None:
        """Every container of the sandbox removed (in one engine call: not `run --rm`, whose removal would hold
        each run's end back by the engine's teardown, and count against its wall-clock limit)."""
        for marker in list(self._runs):
            self._close_run(marker)
        started, self._started = self._started, []
        if started:
            await self._engine(*REMOVE.get(self.kind, ("rm", "-f")), *started)

    async def _engine(self, *args: str) -> str:
        return await engine_command(self.engine, *args)


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


def container_init(init: list[str]) -> list[str]:
    """The program init's command as the container runs it: the image's interpreter, the environment prelude,
    and the run's files at RUN_MOUNT for its STATUS and LIFELINE in place of the descriptors' numbers it is given
    on the host (see `runtimes.program_init` for the layout: `python -I -S -c SOURCE STATUS LIFELINE ...`)."""
    return [INIT_PYTHON, *init[1:4], ENVIRON_PRELUDE + init[4], f"{RUN_MOUNT}/status", f"{RUN_MOUNT}/lifeline",
            *init[7:]]


def scratch_mounts(launch: Launch) -> list[str]:
    """The container's /tmp, /var/tmp, /dev/shm and home: where the sandbox's folder is one tmpfs capped at
    `disk_mb` (as root), its subfolders bound there, so they and the working directory share that one cap, and
    what the program leaves there is the host's to read and goes with the folder; else (no tmpfs of ours) a
    private tmpfs of `disk_mb` each."""
    if not os.path.ismount(launch.workdir.parent):
        size = launch.limits.disk_mb
        return ["--tmpfs", f"/tmp:size={size}m", "--tmpfs", f"/var/tmp:size={size}m", "--shm-size", f"{size}m"]
    return [flag for inside, source in private_folders(launch.workdir)
            for flag in ("-v", f"{source}:{inside}:nosuid,nodev")]


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

    def __init__(self, limits: Limits | None = None, *, image: str = IMAGE) -> None:
        self.limits, self.image = limits or Limits(), image

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
        return ProcessSandbox(ContainerConfinement(engine, self.image), self.limits)


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
