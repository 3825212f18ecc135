"""The escape battery: hostile programs under every runtime this host has. Each is contained: it ends with a
classified result, nothing of it survives the sandbox's close, host files and processes are untouched, and the
sandbox (and this process) keep working. The nastiest cases also run as rollouts through a real env server
(tests/tasksets/test_escape_rollouts.py)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from runtime_helpers import wait_until
from sandbox_helpers import QUICK, isolated, processes_with, runtimes

from tracegym.runtimes.process_sandbox import remove_abandoned_workdirs, sandbox_processes
from tracegym.runtimes.sandbox import Limits, ProgramResult, Runtime, Sandbox

PY = "python3"


@pytest.fixture(params=runtimes())
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    """A sandbox of one runtime; after the test, its close must leave no process of it alive."""
    runtime: Runtime = request.param
    box = await runtime.open()
    try:
        yield box
    finally:
        await box.close()
        left = sandbox_processes(f"{box.id}/", box.uid)  # type: ignore[attr-defined]
        assert not left, f"processes of the sandbox outlived its close: {left}"
        assert not box.workdir.exists()


async def still_works(box: Sandbox) -> None:
    """The sandbox runs a well-behaved program afterwards, and this process can still start one."""
    after = await box.run([PY, "-c", "print(6 * 7)"])
    assert after.ok and after.stdout.strip() == "42", after
    assert subprocess.run(["true"]).returncode == 0


def ended_by(result: ProgramResult, *limits: str) -> None:
    assert not result.ok
    assert result.limit in limits, result


async def test_escape_fork_bomb(sandbox: Sandbox) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = await sandbox.run([PY, "-c", bomb], limits=QUICK.model_copy(update={"wall_seconds": 2.0}))
    ended_by(result, "processes", "wall")
    await still_works(sandbox)


async def test_escape_memory_hog(sandbox: Sandbox) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(10_000_000))"
    # wall and CPU limits far past what filling 256 MB takes (0.35 s here at load 7): on a loaded machine, or one
    # reclaiming memory, the page faults may take seconds of both, and the run must end by its memory limit alone
    result = await sandbox.run([PY, "-c", hog], limits=QUICK.model_copy(update={"wall_seconds": 30.0,
                                                                                "cpu_seconds": 30}))
    ended_by(result, "memory")
    if result.memory_scope == "process":  # RLIMIT_AS: the allocation failed; a cgroup's cap OOM-kills instead
        assert "MemoryError" in result.stderr
    await still_works(sandbox)


async def test_escape_cpu_spin(sandbox: Sandbox) -> None:
    result = await sandbox.run([PY, "-c", "while True: pass"],
                               limits=QUICK.model_copy(update={"cpu_seconds": 1, "wall_seconds": 4.0}))
    ended_by(result, "cpu", "wall")  # cpu unless this machine's other load starves it past the wall
    assert result.duration_s < 30  # the spin is endless: a limit ended it
    await still_works(sandbox)


async def test_escape_infinite_output(sandbox: Sandbox) -> None:
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)"
    result = await sandbox.run([PY, "-c", flood], limits=QUICK.model_copy(update={"wall_seconds": 1.5}))
    ended_by(result, "wall")
    assert result.stdout_truncated and result.stderr_truncated
    assert len(result.stdout) == len(result.stderr) == QUICK.output_bytes
    await still_works(sandbox)


async def test_escape_writing_outside_the_workdir(sandbox: Sandbox, tmp_path: Path) -> None:
    host_file = tmp_path / "host.txt"
    host_file.write_text("precious")
    shared_tmp = Path("/tmp") / f"tracegym-escape-{secrets.token_hex(4)}"
    program = (f"import pathlib\nfor target in [{str(host_file)!r}, {str(tmp_path / 'new.txt')!r}, "
               f"'/etc/tracegym-escape', {str(shared_tmp)!r}]:\n"
               "    try:\n        pathlib.Path(target).write_text('owned')\n        print('wrote', target)\n"
               "    except OSError as exc:\n        print('refused', target, exc.errno)")
    result = await sandbox.run([PY, "-c", program])
    assert result.exit_code == 0, result
    assert f"refused {host_file}" in result.stdout and "refused /etc/tracegym-escape" in result.stdout
    await sandbox.close()
    assert host_file.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.txt"]
    assert not Path("/etc/tracegym-escape").exists()
    assert not shared_tmp.exists()  # a private /tmp, or the sandbox uid's files removed at close


async def test_escape_reading_a_host_secret(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"hunter2-{secrets.token_hex(8)}"
    monkeypatch.setenv("TRACEGYM_HOST_SECRET", secret)
    program = ("import os, pathlib, sys\nprint(dict(os.environ))\n"
               f"for pid in ['1', 'self', '{os.getpid()}', '{os.getppid()}']:\n"
               "    try:\n        print(pathlib.Path(f'/proc/{pid}/environ').read_bytes())\n"
               "    except OSError as exc:\n        print('refused', pid, exc.errno)")
    result = await sandbox.run([PY, "-c", program])
    assert result.exit_code == 0, result
    assert secret not in result.stdout and "TRACEGYM_HOST_SECRET" not in result.stdout


async def test_escape_connecting_to_a_canary_on_loopback(sandbox: Sandbox, request: pytest.FixtureRequest) -> None:
    if not isolated(request.node.callspec.params["sandbox"]):
        pytest.skip("the process-group fallback has no network namespace (documented: no network isolation)")
    connections: list[bytes] = []

    async def canary(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(canary, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    program = ("import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', "
               f"{port}), timeout=2)\n    s.sendall(b'escaped')\n    print('connected')\nexcept OSError as exc:\n"
               "    print('refused', exc)\n    raise SystemExit(1)")
    async with server:
        result = await sandbox.run([PY, "-c", program])
        await asyncio.sleep(0.2)
    assert result.exit_code == 1 and "refused" in result.stdout, result
    assert connections == []


async def test_escape_leaving_a_setsid_daemon(sandbox: Sandbox) -> None:
    token = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(10**6)}"  # a sleep no one else runs
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               f"        os.execve('/bin/sleep', ['sleep', '{token}'], {{}})\n    os._exit(0)\n"
               "time.sleep(0.3)\nprint('parent leaves')")
    result = await sandbox.run([PY, "-c", program])
    assert result.exit_code == 0 and "parent leaves" in result.stdout, result
    await sandbox.close()
    assert wait_until(lambda: not processes_with(token), 5), f"the daemon survived: {processes_with(token)}"


async def test_escape_killing_its_parent(sandbox: Sandbox) -> None:
    bystander = subprocess.Popen(["sleep", "60"])  # a host process the program is told about
    try:
        program = ("import os, signal\nfor pid in (os.getppid(), "
                   f"{bystander.pid}, {os.getpid()}):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
                   "        print('killed', pid)\n    except OSError as exc:\n        print('refused', pid, exc.errno)")
        result = await sandbox.run([PY, "-c", program])
        assert result.exit_code is not None or result.start_error, result
        assert bystander.poll() is None, "the sandbox killed a host process"
        await still_works(sandbox)
    finally:
        bystander.kill()
        bystander.wait()



async def test_escape_filling_the_disk(sandbox: Sandbox, request: pytest.FixtureRequest) -> None:
    """Files of 0.5 MB (under the file-size limit) until the disk is full: the working directory (and under
    bubblewrap its private /tmp and /dev/shm) holds at most `disk_mb`, and the run ends by the disk limit."""
    if os.geteuid() != 0:
        pytest.skip("not root: the working directory is a plain folder, uncapped (documented)")
    assert sandbox.disk_capped  # type: ignore[attr-defined]
    private = request.node.callspec.params["sandbox"].name == "bubblewrap"
    for folder in (".", "/tmp", "/dev/shm") if private else (".",):
        fill = f"for i in range(200):\n    open(f'{folder}/fill{{i}}', 'wb').write(b'x' * 500_000)"
        result = await sandbox.run([PY, "-c", fill])
        ended_by(result, "disk")
        assert "No space left on device" in result.stderr, result
    total = sum(p.stat().st_size for p in sandbox.workdir.iterdir())
    assert 0 < total <= QUICK.disk_mb << 20
    await still_works(sandbox)

async def test_escape_replacing_a_task_file_with_a_symlink_between_runs(sandbox: Sandbox, tmp_path: Path) -> None:
    """The host writes a task file, the program swaps it (and a folder) for links to host files; the host's next
    write replaces the link, its reads never follow one."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    victim.chmod(0o600)
    sandbox.write_file("solution.py", "print('first')")
    program = (f"import os\nos.remove('solution.py')\nos.symlink({str(victim)!r}, 'solution.py')\n"
               f"os.symlink({str(victim)!r}, 'result.txt')\nos.symlink({str(tmp_path)!r}, 'sub')\n"
               "os.mkfifo('pipe')")
    result = await sandbox.run([PY, "-c", program])
    assert result.ok, result
    sandbox.write_file("solution.py", "print('second')")
    with pytest.raises(OSError):  # a linked folder is not followed either
        sandbox.write_file("sub/planted.txt", "x")
    assert victim.read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]
    assert sandbox.read_file("solution.py") == b"print('second')"
    assert sandbox.read_file("result.txt") is None and sandbox.read_file("sub/victim.txt") is None
    assert sandbox.read_file("pipe") is None  # a FIFO does not block the host
    again = await sandbox.run([PY, "solution.py"])
    assert again.ok and again.stdout.strip() == "second", again


async def test_escape_renaming_its_workdir_and_leaving_a_symlink(sandbox: Sandbox, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    """The program renames its working directory away and leaves a link to a host folder in its place: it
    cannot (the folder above is the host's), so the host's next write lands in the sandbox, not the host folder."""
    runtime = request.node.callspec.params["sandbox"]
    if os.geteuid() != 0 and runtime.name == "subprocess":
        pytest.skip("not root: the program runs as us and may write what we may (documented)")
    target = tmp_path / "host-folder"
    target.mkdir(mode=0o700)
    program = ("import os\nw = os.getcwd()\nfor step in (lambda: os.rename(w, w + '-moved'), "
               f"lambda: os.symlink({str(target)!r}, w)):\n"
               "    try:\n        step()\n        print('done')\n    except OSError as exc:\n"
               "        print('refused', exc.errno)")
    result = await sandbox.run([PY, "-c", program])
    assert result.exit_code == 0, result
    sandbox.write_file("solution.py", "print('host')")
    assert list(target.iterdir()) == []
    assert sandbox.read_file("solution.py") == b"print('host')"
    assert sandbox.workdir.is_dir() and not sandbox.workdir.is_symlink()
    assert not Path(f"{sandbox.workdir}-moved").exists()


@pytest.mark.parametrize("runtime", runtimes())
async def test_escape_outliving_a_killed_host(runtime: Runtime, tmp_path: Path) -> None:
    """The host process itself dies by SIGKILL mid-run: the lifeline ends the sandbox's program anyway."""
    token = f"{secrets.randbelow(10**6) + 10**6}.{secrets.randbelow(10**6)}"
    script = tmp_path / "host.py"
    script.write_text(
        "import asyncio, sys\nfrom tracegym.runtimes.catalog import runtime_for\n"
        "from tracegym.runtimes.limited_process import LimitedProcess\n"
        "async def main():\n"
        f"    runtime = LimitedProcess(isolation={getattr(runtime, 'isolation', None)!r}) "
        f"if {runtime.name!r} == 'subprocess' else runtime_for({runtime.name!r})\n"
        "    box = await runtime.open()\n    print('started', flush=True)\n"
        f"    await box.run(['sleep', '{token}'])\nasyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        assert host.stdout is not None and host.stdout.readline() == b"started\n"
        assert wait_until(lambda: bool(processes_with(token)), 10), "the program never started"
    finally:
        host.kill()
        host.wait()
    assert wait_until(lambda: not processes_with(token), 5), "the program outlived its host"
    abandoned = list(Path(tempfile.gettempdir()).glob(f"tracegym-sandbox-{host.pid}-*"))  # no one left to remove
    remove_abandoned_workdirs.cache_clear()  # them (the sandbox's folder; a container's run folder beside it)
    removed = remove_abandoned_workdirs()  # the next process's first sandbox does
    assert abandoned and set(abandoned) <= set(removed) and not any(path.exists() for path in abandoned)


def test_escape_battery_limits_are_quick() -> None:
    assert QUICK.wall_seconds <= 3 and isinstance(QUICK, Limits)
