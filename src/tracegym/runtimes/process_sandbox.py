"""Process sandbox: the Sandbox every process-based runtime gives; a working directory, a host uid of its own
where we are root, and programs run through the program init inside the runtime's confinement.

A runtime differs from another only in its Confinement: the command that wraps the init (namespaces, bubblewrap,
a container) and how it is spawned. Everything else is here, once: the scrubbed environment, the bounded
capture of stdout and stderr, the wall-clock limit, how an ending is read (`ProgramResult.limit`), and the
sweep that leaves no process and no file of the sandbox behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.sandbox import Forward, Limits, ProgramResult
from tracegym.runtimes.workdir import (
    READ_CAP_BYTES,
    SCRATCH,
    WORKDIR_PREFIX,
    make_workdir,
    read_file,
    remove_workdir,
    write_file,
)

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
"""PATH inside every sandbox: the system's programs, never the host user's own folders or virtualenvs."""
MARKER = "TRACEGYM_SANDBOX"
"""Environment variable naming the sandbox in each of its processes (found by the sweep where no namespace is)."""
UID_RANGE = (1_000_000, 2_000_000_000)
"""Host uids handed to sandboxes when we are root: far above any account's, one random draw per sandbox."""
INIT_SOURCE = (Path(__file__).parent / "program_init.py").read_text()
PROBE_TIMEOUT_S = 10.0
"""How long a runtime's probe of this host (a trial sandbox, the container engine's `info`) may take."""
READ_GRACE_S = 1.0
"""How long the output pipes may stay open after the program ended (a survivor holding them is then killed)."""
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_PROCESS_SIGNS = ("Resource temporarily unavailable", "BlockingIOError", "fork: retry")
_FILE_SIZE_SIGNS = ("File too large",)
_DISK_SIGNS = ("No space left on device",)


@dataclass(frozen=True)
class Launch:
    """What one run starts: the program, the program init that runs it, where, and under what."""

    argv: list[str]
    init: list[str]
    workdir: Path
    limits: Limits
    env: Mapping[str, str]
    """The program's whole environment (the wrapper is started with it too)."""
    marker: str
    uid: int | None
    """The sandbox's own host uid (None when we are not root)."""
    forward: Forward | None = None
    """The host service the init carries into the run's own network namespace (None: none, or the run shares
    the host's network)."""


class Confinement:
    """What makes one runtime's sandboxes: the command that wraps a run, and how it is spawned and cleaned up.
    The defaults suit a wrapper that runs the program init on this host; a runtime overrides what differs."""

    private_tmp: bool = False
    """True when the sandbox has its own /tmp (nothing it writes there reaches the host)."""
    kills_on_init_exit: bool = True
    """True when the init's exit ends every process of the sandbox (a PID namespace); else a sweep finds them."""
    network_namespace: bool = True
    """True when a run without `Limits.network` has a network namespace of its own (a Forward is then carried
    into it by the init); else it shares the host's and reaches a forwarded service there directly."""
    cannot_forward: str | None = None
    """Why this runtime cannot carry a Forward (None: it can)."""

    def wrap(self, launch: Launch) -> list[str]:
        """The command that runs `launch` confined."""
        raise NotImplementedError

    def spawn_user(self, uid: int | None) -> int | None:
        """The host uid to spawn the wrapper as (None: ours); `uid` is the sandbox's own, when we are root."""
        return None

    def init_drops_to(self, uid: int | None) -> int | None:
        """The uid the program init drops to before exec (None: it keeps the one it starts with)."""
        return uid

    def spawn_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment the wrapper starts with: the program's (a wrapper that passes on only what it is
        told adds what it needs itself)."""
        return dict(env)

    def exit_status(self, returncode: int | None) -> dict[str, Any] | None:
        """How the program ended, read from the wrapper's exit status where no program init reports it (a
        container engine's); None: read the init's report."""
        return None

    async def reap(self, marker: str) -> None:
        """After a run was killed (wall limit, cancel): end what of it lives outside our process tree."""

    async def release(self, sandbox_id: str) -> None:
        """At the sandbox's close: remove what of it lives outside our process tree."""


@dataclass(eq=False)
class _Run:
    """One program run in flight: its wrapper process and the pipes to its init."""

    proc: asyncio.subprocess.Process
    status_r: int
    marker: str
    """The value of MARKER in this run's processes (`<sandbox id>/<run number>/`)."""
    killed: bool = False
    """True once we killed it (wall limit, cancel)."""


class ProcessSandbox:
    """A Sandbox over a Confinement (see `runtimes.sandbox` for the contract)."""

    def __init__(self, confinement: Confinement, limits: Limits) -> None:
        self.confinement, self.limits = confinement, limits
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        """`<owner pid>-<random>`: its processes' markers and its working directory's name start with it."""
        self.uid = random.randrange(*UID_RANGE) if os.geteuid() == 0 else None
        """The sandbox's own host uid when we are root (its programs run as it), else None."""
        remove_abandoned_workdirs()
        self._workdir, self.disk_capped = make_workdir(self.id, self.uid, limits.disk_mb)
        """`disk_capped`: whether the sandbox's files (working directory, and where namespaced its /tmp, /var/tmp,
        /dev/shm and home) share one tmpfs capped at `limits.disk_mb` (see `runtimes.workdir`)."""
        self._running: set[_Run] = set()
        self._runs = 0
        self._closed = False

    @property
    def workdir(self) -> Path:
        return self._workdir

    def write_file(self, name: str, content: str | bytes) -> None:
        write_file(self._workdir, name, content)

    def read_file(self, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
        return read_file(self._workdir, name, cap)

    def cannot_forward(self) -> str | None:
        return self.confinement.cannot_forward

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                  limits: Limits | None = None, forward: Forward | None = None) -> ProgramResult:
        if self._closed:
            return ProgramResult(argv=list(argv), exit_code=None, start_error="the sandbox is closed")
        if not argv:
            return ProgramResult(argv=[], exit_code=None, start_error="no command given")
        limits = limits or self.limits
        if forward is not None and self.confinement.cannot_forward:
            return ProgramResult(argv=list(argv), exit_code=None, start_error=self.confinement.cannot_forward)
        if limits.network or not self.confinement.network_namespace:
            forward = None  # the run shares the host's network: it reaches the service's own port there
        start = time.monotonic()
        status_r, status_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()  # our end stays open while we live; the init ends all at its EOF
        self._runs += 1
        marker = f"{self.id}/{self._runs}/"
        try:
            proc = await self._spawn(Launch(list(argv), [], self._workdir, limits, self._environment(env or {}, marker),
                                            marker, self.uid, forward), stdin is not None, status_w, lifeline_r)
        except OSError as exc:  # the wrapper itself could not start: say so, as for a missing program
            os.close(status_r)
            os.close(lifeline_w)
            return ProgramResult(argv=list(argv), exit_code=None, start_error=f"{type(exc).__name__}: {exc}")
        finally:
            os.close(status_w)
            os.close(lifeline_r)
        run = _Run(proc, status_r, marker)
        self._running.add(run)
        try:
            return await self._wait(run, list(argv), stdin, limits, start)
        finally:
            self._running.discard(run)
            os.close(lifeline_w)
            os.close(status_r)
            if run.killed:
                await self.confinement.reap(marker)

    async def _spawn(self, launch: Launch, with_stdin: bool, status_w: int,
                     lifeline_r: int) -> asyncio.subprocess.Process:
        drops_to = self.confinement.init_drops_to(self.uid)
        forward = "-" if launch.forward is None else f"{launch.forward.port}:{launch.forward.socket}"
        init = [sandbox_python(), "-I", "-S", "-c", INIT_SOURCE, str(status_w), str(lifeline_r),
                "-" if drops_to is None else str(drops_to), str(self._workdir), forward,
                *map(str, self._rlimits(launch.limits)), "--", *launch.argv]
        launch = replace(launch, init=init)
        ids = spawn_as(self.confinement.spawn_user(self.uid))
        return await asyncio.create_subprocess_exec(
            *self.confinement.wrap(launch),
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=self.confinement.spawn_env(launch.env), start_new_session=True, pass_fds=(status_w, lifeline_r), **ids)

    def _environment(self, extra: Mapping[str, str], marker: str) -> dict[str, str]:
        """Nothing of the host's environment: a fixed base, the caller's `env`, and the run's marker."""
        home = str(self._workdir)
        return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, **extra, MARKER: marker}

    def _rlimits(self, limits: Limits) -> list[int]:
        """The init's rlimits, in its order. RLIMIT_NPROC counts every process of a uid: exact under a uid of our
        own, else the user's processes now plus the limit (approximate: the user's other processes come and go)."""
        own_uid = self.uid is not None
        processes = limits.processes + (3 if own_uid else _processes_of(os.getuid()))  # + init and wrapper
        return [limits.cpu_seconds, limits.memory_mb, limits.file_size_mb, limits.open_files, processes]

    async def _wait(self, run: _Run, argv: list[str], stdin: bytes | None, limits: Limits,
                    start: float) -> ProgramResult:
        proc = run.proc
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout, limits.output_bytes), _Capture(proc.stderr, limits.output_bytes)
        feed = asyncio.ensure_future(_feed(proc.stdin, stdin))
        timed_out, swept = False, 0
        try:
            await asyncio.wait_for(proc.wait(), limits.wall_seconds)
        except TimeoutError:
            timed_out = run.killed = True
            _kill_group(proc)
        except asyncio.CancelledError:
            run.killed = True
            _kill_group(proc)
            for task in (out.reading, err.reading, feed):
                task.cancel()
            raise
        if not self.confinement.kills_on_init_exit:  # outside a PID namespace, what the program started outlives it
            alone = self._running == {run}  # the sandbox's uid is this run's alone: sweep by it too
            left = sandbox_processes(run.marker, self.uid if alone else None)
            _kill_all(left)
            swept = len(left)
        (stdout, out_cut), (stderr, err_cut) = await out.finish(READ_GRACE_S), await err.finish(READ_GRACE_S)
        feed.cancel()
        status = self.confinement.exit_status(proc.returncode) if not timed_out else None
        status = status or _read_status(run.status_r)
        result = classify(argv, status, proc.returncode, timed_out, stdout, stderr, out_cut, err_cut, limits,
                          time.monotonic() - start)
        result.left_running = (status or {}).get("left_running") or swept
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for run in list(self._running):
            run.killed = True
            _kill_group(run.proc)
        self.sweep()
        await self.confinement.release(self.id)
        if self.uid is not None and not self.confinement.private_tmp:
            _remove_files_of(self.uid)
        remove_workdir(self._workdir.parent, onerror=_force_remove)

    def sweep(self) -> list[int]:
        """SIGKILL every process of this sandbox still alive (found by its uid or its environment marker);
        their pids. Under a PID namespace none should be left: this is the proof, and the fallback's reaper."""
        found = sandbox_processes(f"{self.id}/", self.uid)
        _kill_all(found)
        return found


@functools.cache
def remove_abandoned_workdirs() -> list[Path]:
    """Remove the working directories whose owner process is gone (killed before its sandboxes closed); the ones
    removed. Once per process, at its first sandbox."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        owner = folder.name.removeprefix(WORKDIR_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not process_alive(int(owner)):
            remove_workdir(folder, onerror=_force_remove)
            removed.append(folder)
    return removed


def spawn_as(uid: int | None) -> dict[str, Any]:
    """The subprocess arguments that start a process as `uid` (its group, no others); none for None (ours)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def sandbox_processes(marker: str, uid: int | None = None) -> list[int]:
    """Live processes of a sandbox: run by its `uid`, or carrying a MARKER that starts with `marker` (a sandbox's
    id and a slash: all its runs; a run's marker: that run)."""
    prefix = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or not process_alive(int(entry.name)):
            continue
        try:
            if (uid is not None and entry.stat().st_uid == uid) or _carries(entry / "environ", prefix):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _carries(environ: Path, prefix: bytes) -> bool:
    return any(variable.startswith(prefix) for variable in environ.read_bytes().split(b"\0"))


def sandbox_python() -> str:
    """The interpreter that runs the program init: the system's python3 (any sandbox uid can execute it), else
    ours."""
    return shutil.which("python3", path=SANDBOX_PATH) or sys.executable


class _Capture:
    """Reads one output pipe to its end, keeping its first `keep` bytes (what was read survives a cut-off)."""

    def __init__(self, stream: asyncio.StreamReader, keep: int) -> None:
        self.kept, self.dropped, self.keep = bytearray(), False, keep
        self.reading = asyncio.ensure_future(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            room = self.keep - len(self.kept)
            self.dropped = self.dropped or len(chunk) > room
            self.kept += chunk[:max(room, 0)]

    async def finish(self, grace_s: float) -> tuple[bytes, bool]:
        """What was kept and whether any was dropped, waiting at most `grace_s` for the pipe's end (a process that
        outlived the program may hold it open)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.reading), grace_s)
        self.reading.cancel()
        return bytes(self.kept), self.dropped


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if pipe is None or data is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
        pipe.close()


def _read_status(fd: int) -> dict[str, Any] | None:
    """The init's report (see `program_init`), or None when it never wrote one (it was killed: wall limit,
    cancel)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    lines = data.decode(errors="replace").split("\n")
    fields = lines[0].split()
    if len(fields) != 4:
        return None
    exit_code, sig, cpu, left = (None if f == "-" else f for f in fields)
    return {"exit_code": None if exit_code is None else int(exit_code), "signal": None if sig is None else int(sig),
            "cpu_s": float(cpu or 0), "left_running": int(left or 0), "start_error": lines[1] if len(lines) > 1 else ""}


def classify(argv: list[str], status: dict[str, Any] | None, returncode: int | None, timed_out: bool,
             stdout: bytes, stderr: bytes, out_cut: bool, err_cut: bool, limits: Limits,
             duration: float) -> ProgramResult:
    """How a run ended, as a ProgramResult. The wall limit and signals are certain; memory, processes and file
    size are read from the program's own complaint on stderr (it got ENOMEM, EAGAIN or EFBIG and said so)."""
    err_text = stderr.decode(errors="replace")
    result = ProgramResult(argv=argv, exit_code=None, stdout=stdout.decode(errors="replace"), stderr=err_text,
                           stdout_truncated=out_cut, stderr_truncated=err_cut, duration_s=duration)
    if status is None:
        result.signal = -returncode if returncode is not None and returncode < 0 else None
        result.limit = "wall" if timed_out else "sandbox"
        return result
    if status.get("start_error"):
        result.start_error = status["start_error"]
        return result
    result.exit_code, result.signal = status.get("exit_code"), status.get("signal")
    result.limit = _limit_hit(result, float(status.get("cpu_s") or 0.0), limits)
    return result


def _limit_hit(result: ProgramResult, cpu_s: float, limits: Limits) -> str | None:
    if result.signal == signal.SIGXCPU or (result.signal == signal.SIGKILL and cpu_s >= limits.cpu_seconds):
        return "cpu"
    if result.signal == signal.SIGXFSZ:
        return "file_size"
    if result.exit_code != 0:
        tail = result.stderr[-4000:]
        for limit, signs in (("memory", _MEMORY_SIGNS), ("processes", _PROCESS_SIGNS),
                             ("file_size", _FILE_SIZE_SIGNS), ("disk", _DISK_SIGNS)):
            if any(sign in tail for sign in signs):
                return limit
    if result.stdout_truncated or result.stderr_truncated:
        return "output"
    return None


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the wrapper's process group while its leader is unreaped (so the group id cannot be reused)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _processes_of(uid: int) -> int:
    """How many processes `uid` runs now."""
    count = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            count += entry.name.isdigit() and entry.stat().st_uid == uid
    return count


def _remove_files_of(uid: int) -> None:
    """Remove what `uid` left at the top of the world-writable folders."""
    for folder in SCRATCH:
        with contextlib.suppress(OSError):
            for entry in Path(folder).iterdir():
                with contextlib.suppress(OSError):
                    if entry.lstat().st_uid != uid:
                        continue
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, onerror=_force_remove)
                    else:
                        entry.unlink()


def _force_remove(function: Any, path: str, _exc: Any) -> None:
    """rmtree's retry for what a program made unwritable (a folder chmod 0500): make its parent writable."""
    with contextlib.suppress(OSError):
        parent = os.path.dirname(path)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        function(path)
