"""Escape rows: the hostile programs of issue 32's sandbox audit, one row each, and what each row finds.

A row opens sandboxes of one runtime (by its id: `subprocess` as this host detects it, its `process-group`
fallback asked for by name, `bubblewrap`, `container`), sets up what the program should not reach, runs the
program, closes, and returns a Verdict: the escapes it saw (what it read, reached or killed that it must not) and
the leftovers (files and processes of the sandbox alive after its close). A row runs in the test process (as
root), or as the unprivileged test user through this module's command line, a process serving the session's rows:

    python escape_rows.py PROPS_JSON      # each line `ROW RUNTIME_ID` of stdin answered by `VERDICT <json>`

which is why it imports no pytest and nothing of the tests but `runtime_helpers` and `reward_hack`. `Props`
carries what root made for the rows beforehand (sockets, hidden files, a secret in the user's home).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runtime_helpers import wait_until

from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.limited_process import LimitedProcess
from tracegym.runtimes.process_sandbox import SCRATCH
from tracegym.runtimes.sandbox import Limits, ProgramResult, Runtime, Sandbox

PY = "python3"
RUNTIME_IDS = ("subprocess", "subprocess-process-group", "bubblewrap", "container")
"""Every runtime a row runs under: `subprocess` is the isolation this host detects for the user running it."""
ROW_LIMITS = Limits(wall_seconds=10, cpu_seconds=5, memory_mb=256, file_size_mb=1, open_files=64, processes=16,
                    output_bytes=100_000, disk_mb=16)
"""The limits of every row but those about limits themselves."""
SECRET_PREFIX = "tg-battery-secret-"
DEVICES_ALLOWED = frozenset({"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts/ptmx"})
"""The device nodes a sandbox's /dev may hold (and pts/<n> for a terminal)."""


@dataclass
class Props:
    """What root made for the rows before they run (paths on the host)."""

    checkout: str
    """The project's checkout (the grader's source lives under it)."""
    hidden_dir: str
    """A world-readable folder outside every workdir holding `tests_hidden.py` (a task's hidden tests)."""
    path_sockets: list[str] = field(default_factory=list)
    """Listening 0777 Unix sockets under /run/lock, /run (also named through /var/run) and /tmp."""
    home_secret: str | None = None
    """A 0600 file in the test user's home."""
    group_socket: str | None = None
    """A listening 0660 socket owned by the test user's supplementary group."""
    group_file: str | None = None
    """A 0660 file owned by that group."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Verdict:
    """What one row found."""

    escapes: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    skipped: str | None = None
    """Why the row could not run here (the runtime is unavailable)."""
    broken: str | None = None
    """Why the row did not run as meant (its program failed before trying): neither contained nor escaped."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        return cls(**json.loads(text))


Row = Callable[[str, Props], Awaitable[Verdict]]
ROWS: dict[str, Row] = {}


def row(function: Row) -> Row:
    ROWS[function.__name__] = function
    return function


def make_runtime(runtime_id: str, limits: Limits = ROW_LIMITS) -> Runtime:
    """The runtime a row runs under, by its id (see RUNTIME_IDS)."""
    if runtime_id == "subprocess-process-group":
        return LimitedProcess(limits, isolation="process-group")
    return runtime_for(runtime_id, limits)


@contextlib.asynccontextmanager
async def opened(runtime: Runtime) -> AsyncIterator[Sandbox]:
    box = await runtime.open()
    try:
        yield box
    finally:
        await box.close()


def token() -> str:
    """A `sleep` argument no other process on the host runs."""
    return f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(10**6)}"


def processes_with(text: str) -> list[int]:
    """Live processes (not zombies) whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes() \
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def ran(result: ProgramResult, sign: str) -> str | None:
    """None when the program got as far as printing `sign`, else why the row is broken."""
    if sign in result.stdout:
        return None
    return f"the program never printed {sign!r}: {result.model_dump(exclude={'argv'})}"


# --- 1. aggregate memory --------------------------------------------------------------------------------------------

MEMORY_HOG = """
import json, os, select, sys, time
children, mb = int(sys.argv[1]), int(sys.argv[2])
reports_r, reports_w = os.pipe()
release_r, release_w = os.pipe()
pids = []
for _ in range(children):
    pid = os.fork()
    if pid == 0:
        os.close(reports_r); os.close(release_w)
        try:
            held = bytearray(mb << 20)
            held[::4096] = b"\\1" * len(range(0, mb << 20, 4096))  # every page touched: resident
            # proportional: pages shared with the siblings (the interpreter's) count once in all, as the kernel's
            # own accounting (a memory cgroup) counts them
            rss = next(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("Pss:"))
            os.write(reports_w, f"{os.getpid()} {rss // 1024}\\n".encode())
            os.read(release_r, 1)  # hold it until every sibling has reported
        finally:
            os._exit(0)
    pids.append(pid)
os.close(reports_w); os.close(release_r)
print("forked", len(pids), flush=True)
reports, buffer, dead, deadline = [], b"", set(), time.monotonic() + 30
while len({pid for pid, _ in reports} | dead) < children and time.monotonic() < deadline:
    if select.select([reports_r], [], [], 0.1)[0]:
        buffer += os.read(reports_r, 4096)
        *lines, buffer = buffer.split(b"\\n")
        reports += [tuple(map(int, line.split())) for line in lines]
    for pid in pids:
        if pid not in dead and os.waitpid(pid, os.WNOHANG)[0]:
            dead.add(pid)
for pid in pids:  # a child the cap killed after it reported held its memory, but not with the others
    if pid not in dead and os.waitpid(pid, os.WNOHANG)[0]:
        dead.add(pid)
held = [mb for pid, mb in reports if pid not in dead]
print("REPORT", json.dumps({"reports": held, "total_mb": sum(held)}), flush=True)
os.close(release_w)
"""


MEMORY_CHILDREN, MEMORY_CHILD_MB = 6, 200
"""The hog's children, and what each touches: under every per-process cap, over every sandbox's in all."""


async def _aggregate_memory(runtime_id: str, limits: Limits) -> Verdict:
    assert MEMORY_CHILD_MB < limits.memory_mb < MEMORY_CHILDREN * MEMORY_CHILD_MB
    async with opened(make_runtime(runtime_id, limits)) as box:
        result = await box.run([PY, "-c", MEMORY_HOG, str(MEMORY_CHILDREN), str(MEMORY_CHILD_MB)])
    report = next((json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
                   if line.startswith("REPORT ")), None)
    if report is None:
        killed = result.limit == "memory" or result.signal == signal.SIGKILL
        return Verdict() if killed else Verdict(broken=ran(result, "REPORT"))
    if report["total_mb"] > limits.memory_mb:
        return Verdict(escapes=[f"{len(report['reports'])} children of one sandbox held {report['total_mb']} MB "
                                f"resident at once under memory_mb={limits.memory_mb} (each: {report['reports']})"])
    return Verdict()


@row
async def aggregate_memory(runtime_id: str, props: Props) -> Verdict:
    """Six children of one sandbox touch 200 MB each under memory_mb=512, processes=16."""
    return await _aggregate_memory(runtime_id, Limits(memory_mb=512, processes=16, wall_seconds=40, cpu_seconds=20))


@row
async def aggregate_memory_default(runtime_id: str, props: Props) -> Verdict:
    """The same under the default limits (memory_mb=1024)."""
    return await _aggregate_memory(runtime_id, Limits())


@row
async def memory_scope_said(runtime_id: str, props: Props) -> Verdict:
    """Where no cgroup can be made (a runner not root and given none): two sandboxes' results say memory is capped
    per process, and the log says so once, naming memory_mb and processes; an escape is any of it unsaid."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("tracegym").addHandler(handler)
    try:
        runtime = make_runtime(runtime_id)
        async with opened(runtime) as first, opened(runtime) as second:
            results = [await box.run([PY, "-c", "print('ran')"]) for box in (first, second)]
    finally:
        logging.getLogger("tracegym").removeHandler(handler)
    if broken := next(filter(None, (ran(result, "ran") for result in results)), None):
        return Verdict(broken=broken)
    escapes = [f"a result says memory_scope={r.memory_scope!r} where no cgroup was made" for r in results
               if r.memory_scope != "process"]
    per_process = [line for line in said if "per process" in line and "memory_mb" in line and "processes" in line]
    if len(per_process) != 1:
        escapes.append(f"the log said memory is capped per process {len(per_process)} times, not once: {said}")
    return Verdict(escapes=escapes)


@row
async def egress_reached(runtime_id: str, props: Props) -> Verdict:
    """The control of the egress rows: a host port on an allow-list is reached, and its greeting read, through the
    relay (whose sockets the host makes in the sandbox's folder); an escape is none of it coming through."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        greeting = f"{SECRET_PREFIX}{secrets.token_hex(4)}"

        async def answer() -> None:
            client, _ = await asyncio.get_running_loop().sock_accept(server)
            with client:
                client.sendall(greeting.encode())

        server.setblocking(False)
        answering = asyncio.ensure_future(answer())
        program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
                   "print('got', s.recv(100).decode())")
        try:
            async with opened(make_runtime(runtime_id, ROW_LIMITS.model_copy(
                    update={"egress": (f"127.0.0.1:{port}",)}))) as box:
                result = await box.run([PY, "-c", program])
        finally:
            answering.cancel()
    if broken := ran(result, "got"):
        return Verdict(broken=broken)
    return Verdict() if f"got {greeting}" in result.stdout else \
        Verdict(escapes=[f"the allow-listed 127.0.0.1:{port} was not reached: {result.stdout!r}"])


# --- 2. the grader readable -----------------------------------------------------------------------------------------

READ_PATHS = """
import os, sys
for path in sys.argv[1:]:
    try:
        seen = os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(200)
    except OSError as exc:
        print("refused", path, exc.errno)
        continue
    print("readable" if seen else "empty", path, repr(seen[:8]))
print("done")
"""


def grader_paths(props: Props) -> list[str]:
    """Where the grader lives on this host: the module with the reference solutions, the tracegym package, the
    env server's venv (its pyvenv.cfg) and the project's checkout."""
    import pydantic

    import tracegym
    from tracegym.tasksets import function_problems

    venvs = {Path(sys.prefix) / "pyvenv.cfg"} | {parent / "pyvenv.cfg" for parent in Path(pydantic.__file__).parents}
    return [function_problems.__file__, str(Path(tracegym.__file__).parent), props.checkout,
            *sorted(str(p) for p in venvs if p.is_file())]


async def _readable(runtime_id: str, paths: list[str]) -> Verdict:
    async with opened(make_runtime(runtime_id)) as box:
        result = await box.run([PY, "-c", READ_PATHS, *paths])
    broken = ran(result, "done")
    escapes = [line for line in result.stdout.splitlines() if line.startswith("readable ")]
    return Verdict(broken=broken) if broken else Verdict(escapes=escapes)


@row
async def grader_readable(runtime_id: str, props: Props) -> Verdict:
    return await _readable(runtime_id, grader_paths(props))


@row
async def hidden_tests_listable(runtime_id: str, props: Props) -> Verdict:
    return await _readable(runtime_id, [props.hidden_dir, str(Path(props.hidden_dir) / "tests_hidden.py")])


# --- 3. what a non-root deployment loses ----------------------------------------------------------------------------

@row
async def home_secret(runtime_id: str, props: Props) -> Verdict:
    assert props.home_secret, "the home row needs the test user's secret"
    return await _readable(runtime_id, [props.home_secret, str(Path(props.home_secret).parent)])


@row
async def sibling_workdir(runtime_id: str, props: Props) -> Verdict:
    """Two sandboxes of one runtime (GRPO siblings): one writes its answer, the other reads the first's workdir."""
    secret = f"{SECRET_PREFIX}{secrets.token_hex(8)}"
    runtime = make_runtime(runtime_id)
    async with opened(runtime) as first, opened(runtime) as second:
        wrote = await first.run([PY, "-c", f"open('answer.py', 'w').write({secret!r}); print('wrote')"])
        if broken := ran(wrote, "wrote"):
            return Verdict(broken=broken)
        result = await second.run([PY, "-c", READ_PATHS, str(first.workdir), str(first.workdir / "answer.py")])
    broken = ran(result, "done")
    escapes = [line for line in result.stdout.splitlines() if line.startswith("readable ")]
    return Verdict(broken=broken) if broken else Verdict(escapes=escapes)


CONNECT = """
import socket, sys
for path in sys.argv[1:]:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
        print("connected", path)
    except OSError as exc:
        print("refused", path, exc.errno)
print("done")
"""


async def _connectable(runtime_id: str, paths: list[str]) -> Verdict:
    async with opened(make_runtime(runtime_id)) as box:
        result = await box.run([PY, "-c", CONNECT, *paths])
    broken = ran(result, "done")
    escapes = [line for line in result.stdout.splitlines() if line.startswith("connected ")]
    return Verdict(broken=broken) if broken else Verdict(escapes=escapes)


def listening_socket(path: Path, mode: int) -> socket.socket:
    """A Unix socket listening at `path` with `mode` (a connection succeeds from the backlog, unaccepted)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(16)
    path.chmod(mode)
    return server


@row
async def same_uid_socket(runtime_id: str, props: Props) -> Verdict:
    """The user's own listening sockets (default mode: only the same uid may connect), in /tmp and its home."""
    name = f"tg-battery-{secrets.token_hex(4)}.sock"
    paths = [Path(tempfile.gettempdir()) / name, Path.home() / name]
    servers = [listening_socket(path, 0o700) for path in paths]
    try:
        return await _connectable(runtime_id, [str(p) for p in paths])
    finally:
        for server, path in zip(servers, paths, strict=True):
            server.close()
            path.unlink(missing_ok=True)


@row
async def supplementary_group(runtime_id: str, props: Props) -> Verdict:
    """A socket and a file only the user's supplementary group may use (as a docker socket is)."""
    assert props.group_socket and props.group_file, "the group row needs the test user's group socket and file"
    connected = await _connectable(runtime_id, [props.group_socket])
    read = await _readable(runtime_id, [props.group_file])
    return Verdict(escapes=connected.escapes + read.escapes, broken=connected.broken or read.broken)


SCRATCH_WRITER = """
import os, sys
for path in sys.argv[1:]:
    try:
        os.makedirs(path + ".d")
        open(path + ".d/inside", "w").write("x")
        open(path, "w").write("x" * 100_000)
        print("wrote", path)
    except OSError as exc:
        print("refused", path, exc.errno)
print("done")
"""


@row
async def scratch_leftovers(runtime_id: str, props: Props) -> Verdict:
    """Files written in /tmp, /var/tmp and /dev/shm: none on the host after the sandbox's close."""
    paths = [f"{folder}/tg-battery-leftover-{secrets.token_hex(6)}" for folder in SCRATCH]
    try:
        async with opened(make_runtime(runtime_id)) as box:
            result = await box.run([PY, "-c", SCRATCH_WRITER, *paths])
        left = [p for path in paths for p in (path, f"{path}.d") if os.path.lexists(p)]
        broken = ran(result, "done")
        return Verdict(broken=broken) if broken else Verdict(leftovers=[f"{p} after close" for p in left])
    finally:
        subprocess.run(["rm", "-rf", *paths, *(f"{p}.d" for p in paths)], check=False)


DISK_FILLER = """
import os, sys
written = {}
for folder in sys.argv[1:]:
    written[folder] = 0
    for i in range(48):
        try:
            with open(f"{folder}/tg-battery-fill-{i}", "wb") as file:
                file.write(b"x" * 500_000)
            written[folder] += 500_000
        except OSError:
            break
print("WROTE", sum(written.values()) >> 20, written)
"""


@row
async def disk_cap(runtime_id: str, props: Props) -> Verdict:
    """Files of 0.5 MB (under the file-size limit) in the workdir, /tmp, /var/tmp and /dev/shm until each is full:
    all of them together hold at most `disk_mb`."""
    folders = [f"{folder}/tg-battery-disk-{secrets.token_hex(6)}" for folder in SCRATCH]
    program = f"import os\nfor f in {folders!r}:\n    os.makedirs(f, exist_ok=True)\n" + DISK_FILLER
    try:
        async with opened(make_runtime(runtime_id)) as box:
            result = await box.run([PY, "-c", program, ".", *folders])
        line = next((line for line in result.stdout.splitlines() if line.startswith("WROTE ")), None)
        if line is None:
            return Verdict(broken=ran(result, "WROTE"))
        if int(line.split()[1]) > ROW_LIMITS.disk_mb:
            return Verdict(escapes=[f"{line.split(' ', 2)[1]} MB written in all under disk_mb={ROW_LIMITS.disk_mb}: "
                                    f"{line.split(' ', 2)[2]}"])
        return Verdict()
    finally:
        subprocess.run(["rm", "-rf", *folders], check=False)


@row
async def kill_all(runtime_id: str, props: Props) -> Verdict:
    """`kill(-1, SIGKILL)` from inside: a host process of ours (a bystander, and this one) survives it."""
    bystander = subprocess.Popen(["sleep", token()])
    try:
        async with opened(make_runtime(runtime_id)) as box:
            result = await box.run([PY, "-c", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                                    "    print('sent')\nexcept OSError as exc:\n    print('refused', exc.errno)"])
        if bystander.poll() is not None:
            return Verdict(escapes=[f"kill(-1, SIGKILL) killed a host process of this user (pid {bystander.pid})"])
        return Verdict(broken=ran(result, "sent") and ran(result, "refused"))
    finally:
        bystander.kill()
        bystander.wait()


ENVIRON_SCAN = """
import os
marker = "tg-battery-" + "secret-"
found = set()
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for part in ("environ", "cmdline"):
            try:
                data = open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace")
            except OSError:
                continue
            found.update(f"{part}: {item}" for item in data.split("\\0") if marker in item)
print(*sorted(found), sep="\\n")
print("done")
"""
SLEEPER = "import time; time.sleep(60)"


@row
async def proc_environ(runtime_id: str, props: Props) -> Verdict:
    """A host process and a sibling sandbox's program carry secrets in their environment and argv; the program
    reads every /proc/*/environ and /proc/*/cmdline it can."""
    secret = f"{SECRET_PREFIX}{secrets.token_hex(6)}"
    host = subprocess.Popen([sys.executable, "-c", SLEEPER, f"{secret}-host-argv"],
                            env={**os.environ, "TRACEGYM_ENV_SECRET": f"{secret}-host-env"})
    runtime = make_runtime(runtime_id)
    try:
        async with opened(runtime) as sibling, opened(runtime) as box:
            busy = asyncio.ensure_future(sibling.run([PY, "-c", SLEEPER, f"{secret}-sibling-argv"],
                                                     env={"TRACEGYM_ENV_SECRET": f"{secret}-sibling-env"}))
            try:
                if not await asyncio.to_thread(wait_until, lambda: bool(processes_with(f"{secret}-sibling")), 15):
                    return Verdict(broken=f"the sibling sandbox's program never started: {busy}")
                result = await box.run([PY, "-c", ENVIRON_SCAN])
            finally:
                busy.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await busy
    finally:
        host.kill()
        host.wait()
    broken = ran(result, "done")
    escapes = [line for line in result.stdout.splitlines() if secret in line]
    return Verdict(broken=broken) if broken else Verdict(escapes=escapes)


@row
async def loopback_port(runtime_id: str, props: Props) -> Verdict:
    """A port the host listens on at 127.0.0.1 (a canary) is not reachable from inside."""
    with socket.create_server(("127.0.0.1", 0)) as canary:
        port = canary.getsockname()[1]
        program = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                   "    print('connected')\nexcept OSError as exc:\n    print('refused', exc)")
        async with opened(make_runtime(runtime_id)) as box:
            result = await box.run([PY, "-c", program])
    if "connected" in result.stdout:
        return Verdict(escapes=[f"connected to the host's 127.0.0.1:{port}"])
    return Verdict(broken=ran(result, "refused"))


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execve("/bin/sleep", ["sleep", "TOKEN"], {})  # out of the group, no marker in its environment
    os._exit(0)
time.sleep(0.3)
print("parent leaves")
"""


@row
async def daemon_left(runtime_id: str, props: Props) -> Verdict:
    """A double-forked setsid daemon with an empty environment: nothing of it alive after the close."""
    mark = token()
    try:
        async with opened(make_runtime(runtime_id)) as box:
            result = await box.run([PY, "-c", DAEMON.replace("TOKEN", mark)])
        gone = await asyncio.to_thread(wait_until, lambda: not processes_with(mark), 5)
        broken = ran(result, "parent leaves")
        return Verdict(broken=broken) if broken else \
            Verdict(leftovers=[] if gone else [f"the daemon `sleep {mark}` outlived the close: {processes_with(mark)}"])
    finally:
        kill(processes_with(mark))


# --- 4. path-based Unix sockets -------------------------------------------------------------------------------------

@row
async def path_socket(runtime_id: str, props: Props) -> Verdict:
    """0777 sockets the host listens on under /run/lock, /run, /var/run and /tmp: none connectable."""
    return await _connectable(runtime_id, props.path_sockets)


# --- 6. the pipe-holding child --------------------------------------------------------------------------------------

PIPE_WALL_S = 10.0
"""The pipe row's wall limit: a run still going at half of it (5 s for a program that exits at once) waits on the
child."""


@row
async def pipe_holding_child(runtime_id: str, props: Props) -> Verdict:
    """The program exits while its child keeps stdout open and sleeps: the run returns when the program exits
    (judged at half the wall limit, generously), ended on its own, with the child counted as left running and
    killed."""
    mark = token()
    program = f"import subprocess\nsubprocess.Popen(['sleep', '{mark}'])\nprint('parent done', flush=True)"
    limits = ROW_LIMITS.model_copy(update={"wall_seconds": PIPE_WALL_S})
    try:
        async with opened(make_runtime(runtime_id, limits)) as box:
            running = asyncio.ensure_future(box.run([PY, "-c", program]))
            if not (await asyncio.wait({running}, timeout=PIPE_WALL_S / 2))[0]:
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
                return Verdict(escapes=[f"the run had not returned {PIPE_WALL_S / 2:.0f} s after a program that "
                                        f"exits at once (wall limit {PIPE_WALL_S:.0f} s): its child holds stdout"])
            result = running.result()
            gone_after_run = await asyncio.to_thread(wait_until, lambda: not processes_with(mark), 3)
        if broken := ran(result, "parent done"):
            return Verdict(broken=broken)
        escapes = []
        if result.limit is not None:
            escapes.append(f"a program that exited at once was reported as ended by limit={result.limit}")
        if result.left_running < 1:
            escapes.append(f"the child left holding stdout was not counted (left_running={result.left_running})")
        if not gone_after_run:
            escapes.append("the child outlived the run")
        gone = await asyncio.to_thread(wait_until, lambda: not processes_with(mark), 5)
        return Verdict(escapes=escapes, leftovers=[] if gone else [f"`sleep {mark}` outlived the close"])
    finally:
        kill(processes_with(mark))


# --- 9. device nodes ------------------------------------------------------------------------------------------------

DEVICE_LIST = """
import os, stat
for folder, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        path = os.path.join(folder, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            print("device", os.path.relpath(path, "/dev"))
print("done")
"""


@row
async def device_nodes(runtime_id: str, props: Props) -> Verdict:
    async with opened(make_runtime(runtime_id)) as box:
        result = await box.run([PY, "-c", DEVICE_LIST])
    if broken := ran(result, "done"):
        return Verdict(broken=broken)
    nodes = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("device ")]
    extra = [n for n in nodes if n not in DEVICES_ALLOWED and not (n.startswith("pts/") and n[4:].isdigit())]
    return Verdict(escapes=[f"/dev/{n} is visible" for n in extra])


# --- the reward-hack reply ------------------------------------------------------------------------------------------

@row
async def reward_hack(runtime_id: str, props: Props) -> Verdict:
    """The generic reply that finds and exec's the grader's reference solutions, through python-functions
    rollouts under this runtime (by name: the taskset has no process-group fallback)."""
    from reward_hack import install_roots, reply_for

    import tracegym as tg
    from tracegym.tasksets.python_functions import PythonFunctions
    from tracegym.testing import ScriptedModel

    taskset = PythonFunctions({"runtime": runtime_id, "num_tasks": 5, "wall_seconds": 20.0, "cpu_seconds": 10})
    traces = await tg.evaluate(taskset, ScriptedModel(rule=reply_for(install_roots())), num_tasks=5, rollouts=1)
    rewards = {t.task.id: t.reward or 0.0 for t in traces}
    if any(t.errors for t in traces):
        return Verdict(broken=f"rollouts failed: {[e.message for t in traces for e in t.errors]}")
    hacked = {name: r for name, r in rewards.items() if r > 0}
    return Verdict(escapes=[f"the reward-hack reply scored {hacked} of {len(rewards)} tasks"] if hacked else [])


async def run_row(name: str, runtime_id: str, props: Props) -> Verdict:
    """Row `name` under runtime `runtime_id`, or why it cannot run here."""
    reason = make_runtime(runtime_id).unavailable()
    if reason:
        return Verdict(skipped=f"{runtime_id} is unavailable here: {reason}")
    return await ROWS[name](runtime_id, props)


def serve(props: Props) -> None:
    """Answer each line `ROW RUNTIME_ID` of stdin with a line `VERDICT <json>` (a row that raises is broken)."""
    for line in sys.stdin:
        name, runtime_id = line.split()
        try:
            verdict = asyncio.run(run_row(name, runtime_id, props))
        except Exception:
            verdict = Verdict(broken=traceback.format_exc())
        print("VERDICT", verdict.to_json(), flush=True)


if __name__ == "__main__":
    serve(Props(**json.loads(sys.argv[1])))
