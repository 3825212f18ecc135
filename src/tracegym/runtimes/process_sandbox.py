"""Process sandbox: the Sandbox every process-based runtime gives; a working directory, a host uid of its own
where we are root, and programs run through the program init inside the runtime's confinement.

A runtime differs from another only in its Confinement: the command that wraps the init (namespaces, bubblewrap,
a container) and how it is spawned. Everything else is here, once: the sandbox's cgroup (`runtimes.cgroup`: one
cap on the memory and one on the processes of all its programs together, where the host lets us make one), the
scrubbed environment, the bounded capture of stdout and stderr, the wall-clock limit, how an ending is read
(`ProgramResult.limit`), and the sweep that leaves no process and no file of the sandbox behind.

A run ends when its program does: the wrapper's exit is awaited, not its pipes' end (a process the program left
holding stdout would otherwise hold the run: Python 3.11's `Process.wait()` waits for both); what the program left
is then killed (by the PID namespace's end, or by the init killing its process group and a sweep by marker, uid
and cgroup) and counted in `left_running`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from tracegym.core.errors import UsageError
from tracegym.runtimes.cgroup import REMOVE_WITHIN_S, Counts, SandboxCgroup, make_cgroup
from tracegym.runtimes.egress import EgressRelay, EgressRoute
from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.sandbox import Forward, Limits, ProgramResult, RuntimeUnavailable
from tracegym.runtimes.workdir import (
    READ_CAP_BYTES,
    RELAY,
    SCRATCH,
    WORKDIR_PREFIX,
    enter_disk,
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
_COMPILE_INIT = ("import binascii,marshal,sys;sys.stdout.write(binascii.b2a_base64(marshal.dumps(compile("
                 "sys.stdin.read(),'program_init','exec',optimize=2)),newline=False).decode())")
_MAX_ARGUMENT = 120_000
"""The longest `-c` argument we pass (the kernel's limit on one argument is 128 KiB)."""
PROBE_TIMEOUT_S = 10.0
"""How long a runtime's probe of this host (a trial sandbox, the container engine's `info`) may take."""
READ_GRACE_S = 1.0
"""How long the output pipes may stay open after the program ended (a survivor holding them is then killed)."""
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_PROCESS_SIGNS = ("Resource temporarily unavailable", "BlockingIOError", "fork: retry")
_FILE_SIZE_SIGNS = ("File too large",)
_DISK_SIGNS = ("No space left on device",)
log = logging.getLogger(__name__)


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
    egress: EgressRoute | None = None
    """The allow-list's destinations the init carries into the run's own network namespace (None: no allow-list,
    or the run shares the host's network)."""
    cgroup: tuple[Path, ...] = ()
    """The entry files of the sandbox's cgroup (none: no cgroup of ours), for a wrapper that passes no descriptor
    on (a container's: its init opens them where they are bound)."""


def socket_folders(launch: Launch) -> list[Path]:
    """The host folders of the Unix sockets a run's init reaches from inside its sandbox: the proxy's (a Forward)
    and its egress relay's."""
    forward = [] if launch.forward is None else [launch.forward.socket.parent]
    return forward + ([] if launch.egress is None else [launch.egress.folder])


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
    """Why this runtime cannot carry a Forward (None: it can); nor then an egress allow-list (the same init
    carries both)."""
    cannot_egress: str | None = None
    """Why this runtime cannot enforce an egress allow-list though it can carry a Forward (None: it can)."""
    disk_namespace: bool = False
    """True when the wrapper can start inside the namespaces of the keeper that caps the sandbox's files where we
    are not root (see `runtimes.workdir`): it makes the sandbox's own namespaces itself."""
    sandbox_cgroup: bool = True
    """True when a cgroup of ours holds the sandbox's programs (False where the runtime's engine makes its own: a
    container's, where the engine can cap one)."""
    init_on_host: bool = True
    """True when this host's python3 runs the program init (it is then given compiled; a container's image's
    python3 is given its source)."""

    def wrap(self, launch: Launch) -> list[str]:
        """The command that runs `launch` confined."""
        raise NotImplementedError

    def disk_holder(self) -> int | None:
        """The process in whose user and mount namespaces the wrapper's mounts are made, where that is not this
        process's (a rootless container engine's): the sandbox's tmpfs is mounted there (None: none)."""
        return None

    async def command(self, launch: Launch) -> list[str]:
        """`wrap(launch)`, once what it needs is ready (a runtime that prepares a run ahead waits for it here)."""
        return self.wrap(launch)

    def spawn_user(self, uid: int | None) -> int | None:
        """The host uid to spawn the wrapper as (None: ours); `uid` is the sandbox's own, when we are root."""
        return None

    def init_drops_to(self, uid: int | None) -> int | None:
        """The uid the program init drops to before exec (None: it keeps the one it starts with)."""
        return uid

    def egress_setup(self, route: EgressRoute, uid: int | None) -> list[str]:
        """The init's NETWORK lines for an allow-list beyond its forwards (see `program_init`): here, the hosts
        file bound over /etc/hosts by the init (root in the run's own mount namespace); a runtime whose wrapper
        binds it itself says otherwise."""
        return [] if route.hosts is None else [f"hosts {route.hosts}"]

    def spawn_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment the wrapper starts with: the program's (a wrapper that passes on only what it is
        told adds what it needs itself)."""
        return dict(env)

    def exit_status(self, returncode: int | None, marker: str) -> dict[str, Any] | None:
        """How run `marker`'s program ended (it was not killed), where the init's report does not reach the status
        pipe (a container's: read from its own file, else the engine's exit status); None: read the pipe."""
        return None

    async def reap(self, marker: str) -> None:
        """After a run was killed (wall limit, cancel): end what of it lives outside our process tree."""

    async def release(self, sandbox_id: str) -> None:
        """At the sandbox's close: remove what of it lives outside our process tree."""


@dataclass(eq=False)
class _Run:
    """One program run in flight: its wrapper process and the pipes to its init."""

    proc: asyncio.subprocess.Process
    wrapper: _ExitProtocol
    """Its protocol: `exited` when the wrapper exits (whoever still holds its pipes)."""
    status_r: int
    marker: str
    """The value of MARKER in this run's processes (`<sandbox id>/<run number>/`)."""
    egress: EgressRoute | None = None
    """The allow-list's route the run was started with (what the init's counts are of)."""
    killed: bool = False
    """True once we killed it (wall limit, cancel)."""


class ProcessSandbox:
    """A Sandbox over a Confinement (see `runtimes.sandbox` for the contract)."""

    def __init__(self, confinement: Confinement, limits: Limits) -> None:
        self.confinement, self.limits = confinement, limits
        self.refuse_egress(limits)
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        """`<owner pid>-<random>`: its processes' markers and its working directory's name start with it."""
        self.uid = random.randrange(*UID_RANGE) if os.geteuid() == 0 else None
        """The sandbox's own host uid when we are root (its programs run as it), else None."""
        remove_abandoned_workdirs()
        self._workdir, self.disk_capped = make_workdir(self.id, self.uid, limits.disk_mb, confinement.disk_namespace,
                                                       confinement.disk_holder())
        """`disk_capped`: whether the sandbox's files (working directory, and where namespaced its /tmp, /var/tmp,
        /dev/shm and home) share one tmpfs capped at `limits.disk_mb` (see `runtimes.workdir`)."""
        self.cgroup: SandboxCgroup | None = None
        """Its cgroup (see `runtimes.cgroup`); None where none could be made (memory and processes are then
        capped per process: `memory_scope`)."""
        if confinement.sandbox_cgroup:
            self.cgroup, why = make_cgroup(self.id, limits.memory_mb, limits.processes)
            if why:
                warn_caps_per_process(why)
        self._running: set[_Run] = set()
        self._runs = 0
        self._closed = False
        self.egress: EgressRelay | None = None
        """The relay of this sandbox's egress allow-lists, from its first run under one (see `runtimes.egress`):
        its `use` counts what each entry carried, failed and shed."""

    @property
    def workdir(self) -> Path:
        return self._workdir

    def write_file(self, name: str, content: str | bytes) -> None:
        write_file(self._workdir, name, content)

    def read_file(self, name: str, cap: int = READ_CAP_BYTES) -> bytes | None:
        return read_file(self._workdir, name, cap)

    def cannot_forward(self) -> str | None:
        return self.confinement.cannot_forward

    def cannot_egress(self) -> str | None:
        """Why this sandbox cannot enforce `Limits.egress`, or None when it can."""
        if not self.confinement.network_namespace:
            return ("its programs share the host's network (no network namespace of their own), where every "
                    "host is reachable; use the bubblewrap runtime or the subprocess runtime with namespaces")
        return self.confinement.cannot_forward or self.confinement.cannot_egress

    def refuse_egress(self, limits: Limits) -> None:
        """RuntimeUnavailable naming `limits.egress` when it names hosts this sandbox cannot hold its programs to."""
        if limits.egress and (why := self.cannot_egress()):
            raise RuntimeUnavailable(f"this runtime cannot enforce limits.egress {list(limits.egress)}: {why}")

    @property
    def memory_scope(self) -> Literal["sandbox", "process"]:
        """What `Limits.memory_mb` and `processes` cap: `sandbox` (all its processes together: its cgroup, or a
        container engine's) or `process` (each process alone: rlimits)."""
        return "sandbox" if self.cgroup is not None or not self.confinement.sandbox_cgroup else "process"

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
        try:
            egress = await self._egress_route(limits)
        except (UsageError, RuntimeUnavailable) as exc:
            return ProgramResult(argv=list(argv), exit_code=None, start_error=str(exc))
        start = time.monotonic()
        status_r, status_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()  # our end stays open while we live; the init ends all at its EOF
        self._runs += 1
        marker = f"{self.id}/{self._runs}/"
        cgroup_fds: list[int] = []
        try:
            cgroup_fds, counts = self._enter_cgroup(limits)
            entries = tuple(self.cgroup.entry_files()) if self.cgroup is not None else ()
            proc, wrapper = await self._spawn(
                Launch(list(argv), [], self._workdir, limits, self._environment(env or {}, marker), marker, self.uid,
                       forward, egress, entries), stdin is not None, status_w, lifeline_r, cgroup_fds)
        except OSError as exc:  # the wrapper itself could not start: say so, as for a missing program
            os.close(status_r)
            os.close(lifeline_w)
            return ProgramResult(argv=list(argv), exit_code=None, start_error=f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:  # cancelled before the wrapper started (e.g. waiting on `command`)
            os.close(status_r)
            os.close(lifeline_w)
            raise
        finally:
            for fd in (status_w, lifeline_r, *cgroup_fds):
                os.close(fd)
        run = _Run(proc, wrapper, status_r, marker, egress)
        self._running.add(run)
        try:
            return await self._wait(run, list(argv), stdin, limits, start, counts)
        finally:
            self._running.discard(run)
            os.close(lifeline_w)
            os.close(status_r)
            if wrapper.exited.done():  # else the wrapper is still being killed: its transport closes itself
                wrapper.transport.close()
            if run.killed:
                await self.confinement.reap(marker)

    async def _egress_route(self, limits: Limits) -> EgressRoute | None:
        """The route of a run under `limits.egress`, the sandbox's relay made at its first (None: no allow-list).
        UsageError naming an entry that does not resolve; RuntimeUnavailable where it cannot be enforced."""
        if not limits.egress:
            return None
        self.refuse_egress(limits)
        if self.egress is None:
            self.egress = EgressRelay(self._workdir.parent / RELAY, self.uid)
        return await self.egress.route(limits.egress)

    def _network(self, launch: Launch) -> str:
        """The init's NETWORK argument (see `program_init`): what it sets up in the run's own network namespace."""
        if launch.limits.network or not self.confinement.network_namespace:
            return "-"
        lines = ["own"]
        if launch.forward is not None:
            lines.append(f"forward 127.0.0.1 {launch.forward.port} {launch.forward.socket}")
        if launch.egress is not None:
            lines += [f"egress {d.address} {d.port} {path}" for d, path in launch.egress.destinations]
            lines += self.confinement.egress_setup(launch.egress, self.uid)
        if any("\n" in line for line in lines[1:]):
            raise OSError(f"a socket path holds a line break: {lines[1:]}")
        return "\n".join(lines)

    def _enter_cgroup(self, limits: Limits) -> tuple[list[int], Counts]:
        """The descriptors that put a run's program in the sandbox's cgroup, capped at the run's `memory_mb` and
        `processes` (runs in flight at once share it, under the largest caps they ask for), and its counts now;
        none without a cgroup. OSError when the cgroup cannot be capped so (v1: its files already hold more)."""
        cgroup = self.cgroup
        if cgroup is None:
            return [], Counts()
        memory, processes = limits.memory_mb, limits.processes
        if self._running and cgroup.caps is not None:
            memory, processes = max(memory, cgroup.caps[0]), max(processes, cgroup.caps[1])
        try:
            cgroup.cap(memory, processes)
        except OSError as exc:
            raise OSError(f"the sandbox's cgroup cannot be capped at memory_mb={memory}, processes={processes}: "
                          f"{exc}") from None
        return cgroup.entry_fds(), cgroup.counts()

    async def _spawn(self, launch: Launch, with_stdin: bool, status_w: int, lifeline_r: int,
                     cgroup_fds: list[int]) -> tuple[asyncio.subprocess.Process, _ExitProtocol]:
        """The wrapper started, and its protocol (which says when it exits)."""
        drops_to = self.confinement.init_drops_to(self.uid)
        code = init_code() if self.confinement.init_on_host else INIT_SOURCE
        init = [sandbox_python(), "-I", "-S", "-c", code, str(status_w), str(lifeline_r),
                "-" if drops_to is None else str(drops_to), str(self._workdir), self._network(launch),
                ",".join(map(str, cgroup_fds)) or "-", *map(str, self._rlimits(launch.limits)), "--", *launch.argv]
        launch = replace(launch, init=init)
        as_user, ids = switch_user(self.confinement.spawn_user(self.uid))
        loop = asyncio.get_running_loop()
        command = await self.confinement.command(launch)
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExitProtocol(loop), *enter_disk(self._workdir.parent), *as_user, *command,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=self.confinement.spawn_env(launch.env), start_new_session=True,
            pass_fds=(status_w, lifeline_r, *cgroup_fds), **ids)
        return asyncio.subprocess.Process(transport, protocol, loop), protocol

    def _environment(self, extra: Mapping[str, str], marker: str) -> dict[str, str]:
        """Nothing of the host's environment: a fixed base, the caller's `env`, and the run's marker."""
        home = str(self._workdir)
        return {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, **extra, MARKER: marker}

    def _rlimits(self, limits: Limits) -> list[int]:
        """The init's rlimits, in its order (0: none). RLIMIT_NPROC counts every process of a uid: exact under a
        uid of our own, else the user's processes now plus the limit (approximate: the user's other processes come
        and go; none where a cgroup caps the processes exactly, as it does in a rootless container, where the
        kernel counts the engine's helpers of the user's namespace too). RLIMIT_AS only where no cgroup caps
        memory: the cgroup caps what is used, while an address-space cap refuses what is merely reserved (a JVM's
        heap, V8's cages, Go's arenas: such programs would not start)."""
        own_uid = self.uid is not None
        processes = limits.processes + (3 if own_uid else _processes_of(os.getuid()))  # + init and wrapper
        if not own_uid and self.cgroup is not None:
            processes = 0
        address_space = 0 if self.cgroup is not None else limits.memory_mb
        return [limits.cpu_seconds, address_space, limits.file_size_mb, limits.open_files, processes]

    async def _wait(self, run: _Run, argv: list[str], stdin: bytes | None, limits: Limits,
                    start: float, counts: Counts) -> ProgramResult:
        proc = run.proc
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout, limits.output_bytes), _Capture(proc.stderr, limits.output_bytes)
        feed = asyncio.ensure_future(_feed(proc.stdin, stdin))
        timed_out, swept = False, 0
        try:  # the wrapper's exit, not its pipes' end (a leftover may hold them: it is killed below)
            await asyncio.wait_for(asyncio.shield(run.wrapper.exited), limits.wall_seconds)
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
            alone = self._running == {run}  # the sandbox's uid and cgroup are this run's alone: sweep by them too
            left = set(sandbox_processes(run.marker, self.uid if alone else None))
            if alone and self.cgroup is not None:
                left.update(self.cgroup.members())
            _kill_all(sorted(left))
            swept = len(left)
        (stdout, out_cut), (stderr, err_cut) = await out.finish(READ_GRACE_S), await err.finish(READ_GRACE_S)
        feed.cancel()
        status = self.confinement.exit_status(proc.returncode, run.marker) if not timed_out else None
        status = status or _read_status(run.status_r)
        fired = self.cgroup.counts().fired_since(counts) if self.cgroup is not None else []
        result = classify(argv, status, proc.returncode, timed_out, stdout, stderr, out_cut, err_cut, limits,
                          time.monotonic() - start, fired)
        result.left_running = max((status or {}).get("left_running") or 0, swept)
        result.memory_scope = self.memory_scope
        _note_network(result, status, run.egress, limits)
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for run in list(self._running):
            run.killed = True
            _kill_group(run.proc)
        self.sweep()
        if self.egress is not None:
            await self.egress.close()
        await self.confinement.release(self.id)
        if self.cgroup is not None:
            await self._remove_cgroup(self.cgroup)
        if self.uid is not None and not self.confinement.private_tmp:
            _remove_files_of(self.uid)
        remove_workdir(self._workdir.parent, onerror=_force_remove)

    def sweep(self) -> list[int]:
        """SIGKILL every process of this sandbox still alive (found by its uid, its environment marker or its
        cgroup); their pids. Under a PID namespace none should be left: this is the proof, and the fallback's
        reaper."""
        found = set(sandbox_processes(f"{self.id}/", self.uid))
        found.update(self.cgroup.members() if self.cgroup is not None else [])
        _kill_all(sorted(found))
        return sorted(found)

    async def _remove_cgroup(self, cgroup: SandboxCgroup) -> None:
        """Remove the sandbox's cgroup once the processes killed in it are gone (a leftover is logged; the next
        process's first sandbox removes it as abandoned)."""
        deadline = time.monotonic() + REMOVE_WITHIN_S
        while not cgroup.remove():
            if time.monotonic() > deadline:
                log.warning("sandbox %s: its cgroup %s still holds processes %s after %.0f s; left for the next "
                            "process to remove", self.id, cgroup.memory, cgroup.members(), REMOVE_WITHIN_S)
                return
            await asyncio.sleep(0.01)


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


@functools.cache
def warn_caps_per_process(why: str) -> None:
    """Say once per process (per reason) that sandboxes cap memory and processes per process only."""
    log.warning("sandboxes cap memory_mb and processes per process (rlimits), not per sandbox: no cgroup can be "
                "made here: %s. A sandbox's processes together may hold memory_mb times processes.", why)


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's subprocess protocol, plus `exited`, done when the process exits whoever still holds its pipes
    (`Process.wait()` also waits for the pipes' end), and its `transport`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=1 << 16, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


def spawn_as(uid: int | None) -> dict[str, Any]:
    """The subprocess arguments that start a process as `uid` (its group, no others); none for None (ours)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def switch_user(uid: int | None) -> tuple[list[str], dict[str, Any]]:
    """How a wrapper is started as `uid` (None: ours): a command to put before it, and the subprocess arguments.
    Through util-linux's `setpriv` where the host has it: Python cannot vfork a child that changes its ids
    (`spawn_as`), so it forks, copying this whole process's page tables (2 ms of CPU here at 50 MB, more as the
    process grows, and 15-20 ms of wall time under load), where the vfork and setpriv's exec cost 0.2 ms of ours."""
    setpriv = _setpriv()
    if uid is None or setpriv is None:
        return [], spawn_as(uid)
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"], {}


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv", path=SANDBOX_PATH)


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


@functools.cache
def init_code() -> str:
    """The program init as `sandbox_python()`'s `-c` argument: its code compiled once by that interpreter (without
    docstrings) and carried marshalled, so that a run does not compile the source again (5-6 ms a run here); the
    source itself where that interpreter could not compile it."""
    try:
        done = subprocess.run([sandbox_python(), "-I", "-S", "-c", _COMPILE_INIT], input=INIT_SOURCE.encode(),
                              capture_output=True, timeout=PROBE_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        why = f"{sandbox_python()} could not compile it: {exc}"
    else:
        loader = f"import binascii,marshal;exec(marshal.loads(binascii.a2b_base64('{done.stdout.decode()}')))"
        if len(loader) <= _MAX_ARGUMENT:
            return loader
        why = f"its code takes {len(loader)} bytes, past the {_MAX_ARGUMENT} one argument may take"
    log.warning("the program init runs from its source (a compile per run, some milliseconds): %s", why)
    return INIT_SOURCE


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
            "cpu_s": float(cpu or 0), "left_running": int(left or 0), "start_error": lines[1] if len(lines) > 1 else "",
            "network": lines[2] if len(lines) > 2 else ""}


def _note_network(result: ProgramResult, status: dict[str, Any] | None, route: EgressRoute | None,
                  limits: Limits) -> None:
    """Put on `result` what the init counted in the run's own network namespace (its report's third line: what
    the namespace refused, then the connections to each destination of the route, in order)."""
    counted = [int(n) for n in (status or {}).get("network", "").split()]
    if not counted:  # the run shared the host's network, or its init never reported
        return
    result.refused_connections = counted[0]
    if route is not None:
        per_entry = dict.fromkeys(limits.egress, 0)
        for (destination, _), count in zip(route.destinations, counted[1:], strict=False):
            per_entry[destination.entry] += count
        result.egress_connections = per_entry


def classify(argv: list[str], status: dict[str, Any] | None, returncode: int | None, timed_out: bool,
             stdout: bytes, stderr: bytes, out_cut: bool, err_cut: bool, limits: Limits,
             duration: float, fired: Sequence[str] = ()) -> ProgramResult:
    """How a run ended, as a ProgramResult. The wall limit, signals and the caps a cgroup saw fire (`fired`, in
    a run that did not end cleanly) are certain; without a cgroup, memory, processes and file size are read from
    the program's own complaint on stderr (it got ENOMEM, EAGAIN or EFBIG and said so)."""
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
    result.limit = _limit_hit(result, float(status.get("cpu_s") or 0.0), limits, fired)
    return result


def _limit_hit(result: ProgramResult, cpu_s: float, limits: Limits, fired: Sequence[str]) -> str | None:
    if result.signal == signal.SIGXCPU:
        return "cpu"
    if result.signal == signal.SIGXFSZ:
        return "file_size"
    if result.exit_code != 0 and fired:  # an OOM kill or a refused fork in the sandbox's cgroup, and it failed
        return fired[0]
    if result.signal == signal.SIGKILL and cpu_s >= limits.cpu_seconds:
        return "cpu"
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
