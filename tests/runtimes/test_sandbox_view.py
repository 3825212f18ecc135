"""What a namespaced sandbox sees of the host (bubblewrap, and the subprocess runtime's namespace modes): no host
Unix socket, no /etc secret, nothing of tracegym, its venv, the project or the host's home, device nodes only
when asked, one disk cap over its working directory and scratch folders, and the read-only binds it is given;
and the python-functions reward hack that reads the grader's reference solutions scores 0."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from sandbox_helpers import QUICK, isolated, runtimes

import tracegym as tg
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Limits, Runtime, Sandbox
from tracegym.runtimes.sandbox_view import DEVICES, hidden_paths
from tracegym.runtimes.workdir import make_workdir, remove_workdir
from tracegym.tasksets.python_functions import PythonFunctions
from tracegym.testing import ScriptedModel

PY = "python3"
HACK = (Path(__file__).parent / "reward_hack_reply.py").read_text()
"""The audit's generic python-functions reply: it finds the grader's function_problems.py and binds each
family's reference solution to its name (see the file)."""
ASKED_DEVICE = "/dev/fuse"
"""A world-writable device node this host has (as GPU nodes usually are): shown only when asked for."""


def namespaced() -> list[object]:
    """`runtimes()` without the process-group fallback (no mount namespace: it sees the host's filesystem, as
    documented)."""
    return [param for param in runtimes()  # type: ignore[attr-defined]
            if isolated(param.values[0]) and param.id != "container"]  # a container's root is its image's


@pytest.fixture(params=namespaced())
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    runtime: Runtime = request.param
    box = await runtime.open()
    try:
        yield box
    finally:
        await box.close()


async def output_of(box: Sandbox, program: str, limits: Limits | None = None) -> str:
    result = await box.run([PY, "-c", program], limits=limits)
    assert result.exit_code == 0, result
    return result.stdout


@contextlib.contextmanager
def listening_unix_socket(folder: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = folder / f"tracegym-view-{secrets.token_hex(4)}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(8)
        server.setblocking(False)
        yield path, server
    finally:
        server.close()
        path.unlink(missing_ok=True)


async def test_a_0777_unix_socket_under_run_is_unreachable(sandbox: Sandbox) -> None:
    with listening_unix_socket(Path("/run/lock")) as (path, server):
        program = ("import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
                   f"    s.connect({str(path)!r})\n    print('connected')\n"
                   "except OSError as exc:\n    print('refused', exc)")
        said = await output_of(sandbox, program)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert said.startswith("refused"), said


async def test_etc_shadow_is_unreadable(sandbox: Sandbox) -> None:
    program = ("try:\n    print(open('/etc/shadow').read() or 'empty')\nexcept OSError as exc:\n"
               "    print('refused', exc.errno)")
    said = await output_of(sandbox, program)
    assert said.startswith(("refused", "empty")), said
    assert "root:" not in said


async def test_home_project_venv_and_package_are_invisible(sandbox: Sandbox) -> None:
    planted = Path.home() / f".tracegym-view-secret-{secrets.token_hex(4)}"
    planted.write_text("secret")
    planted.chmod(0o644)  # readable by anyone who sees it: only the view can hide it
    try:
        home = Path.home().resolve()  # the sandbox's own, empty home is there instead
        paths = [str(planted), *(str(p) for p in hidden_paths() if p != home), sys.prefix, tg.__file__]
        program = f"import os\nprint([p for p in {paths!r} if os.path.exists(p)], os.listdir({str(home)!r}))"
        said = await output_of(sandbox, program)
    finally:
        planted.unlink()
    assert said.strip() == "[] []"
    assert {"the tracegym package", "the env server's venv", "the host's home"} <= set(hidden_paths().values())


async def test_walking_the_root_finds_no_tracegym_venv_or_project(sandbox: Sandbox) -> None:
    program = ("import os\nfor top, folders, files in os.walk('/'):\n"
               "    if top in ('/proc', '/sys', '/dev'):\n        folders[:] = []\n        continue\n"
               "    for name in folders + files:\n"
               "        if name in ('function_problems.py', 'tracegym', 'pyvenv.cfg') or "
               "name.startswith('tracegym-0'):\n            print(os.path.join(top, name))")
    said = await output_of(sandbox, program, QUICK.model_copy(update={"wall_seconds": 60.0, "cpu_seconds": 60}))
    assert said == ""


async def test_only_the_minimal_device_nodes_are_there(sandbox: Sandbox) -> None:
    said = await output_of(sandbox, "import os\nprint(' '.join(sorted(os.listdir('/dev'))))")
    minimal = {Path(d).name for d in DEVICES} | {"shm", "fd", "stdin", "stdout", "stderr", "pts", "ptmx", "core"}
    assert set(said.split()) <= minimal, set(said.split()) - minimal
    assert Path(ASKED_DEVICE).name not in said.split()


async def test_a_device_asked_for_is_there_and_opens(sandbox: Sandbox) -> None:
    if not Path(ASKED_DEVICE).is_char_device():
        pytest.skip(f"this host has no {ASKED_DEVICE}")
    program = f"import os\nos.close(os.open({ASKED_DEVICE!r}, os.O_RDWR))\nprint('opened')"
    said = await output_of(sandbox, program, QUICK.model_copy(update={"devices": (ASKED_DEVICE,)}))
    assert said.strip() == "opened"


async def test_tmp_scratch_folders_and_the_workdir_share_one_disk_cap(sandbox: Sandbox) -> None:
    if os.geteuid() != 0:
        pytest.skip("not root: the sandbox's files are uncapped (warned; see the uncapped test)")
    assert sandbox.disk_capped and QUICK.disk_mb == 16  # type: ignore[attr-defined]
    program = ("def fill(folder, mb):\n    written = 0\n    try:\n"
               "        for i in range(mb * 2):\n            with open(f'{folder}/fill{i}', 'wb') as f:\n"
               "                f.write(b'x' * 500_000)\n            written += 500_000\n"
               "    except OSError as exc:\n        print(folder, 'full', exc.errno)\n    return written\n"
               "print('written', fill('/tmp', 12) + fill('/dev/shm', 1) + fill('/var/tmp', 1) + fill('.', 16))")
    said = await output_of(sandbox, program, QUICK.model_copy(update={"file_size_mb": 16, "wall_seconds": 20.0}))
    assert ". full 28" in said and "/tmp full" not in said, said  # ENOSPC in the workdir, after the others took theirs
    assert int(said.split("written ")[1]) <= QUICK.disk_mb << 20


async def test_files_in_tmp_stay_for_the_next_run_and_go_at_close(sandbox: Sandbox) -> None:
    await output_of(sandbox, "open('/tmp/kept', 'w').write('kept')")
    assert (await output_of(sandbox, "print(open('/tmp/kept').read())")).strip() == "kept"
    folder = sandbox.workdir.parent
    await sandbox.close()
    assert not folder.exists()


async def test_a_read_only_bind_is_readable_and_not_writable(sandbox: Sandbox) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tracegym-view-agent-"))
    try:
        folder.chmod(0o755)  # a sandbox's own uid passes through
        (folder / "agent.py").write_text("print('agent code')")
        (folder / "agent.py").chmod(0o666)  # only the bind keeps it read-only
        program = (f"import runpy\nrunpy.run_path({str(folder / 'agent.py')!r})\ntry:\n"
                   f"    open({str(folder / 'agent.py')!r}, 'a').write('owned')\n    print('wrote')\n"
                   "except OSError as exc:\n    print('refused', exc.errno)")
        said = await output_of(sandbox, program, QUICK.model_copy(update={"read_only": (str(folder),)}))
        assert said.split("\n")[:2] == ["agent code", "refused 30"]
        assert (folder / "agent.py").read_text() == "print('agent code')"
    finally:
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()


def test_a_missing_read_only_path_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"read_only[\s\S]*'/nonexistent/agent-venv' is not an existing"):
        Limits(read_only=("/nonexistent/agent-venv",))


def test_a_read_only_path_of_the_venv_package_or_project_is_refused_by_name() -> None:
    package = Path(tg.__file__).parent
    for path in (sys.prefix, str(package / "tasksets"), str(package.parents[1] / "tests")):
        with pytest.raises(ValidationError, match=rf"'{path}' is .* which no sandbox may see"):
            Limits(read_only=(path,))


def test_a_device_that_is_missing_or_not_a_device_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"devices[\s\S]*'/dev/nvidia-nonexistent' does not exist"):
        Limits(devices=("/dev/nvidia-nonexistent",))
    with pytest.raises(ValidationError, match=r"'/etc/hostname' is not a device node"):
        Limits(devices=("/etc/hostname",))


def test_not_root_the_sandbox_folder_is_uncapped_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level(logging.WARNING):
        workdir, capped = make_workdir(f"{os.getpid()}-uncapped-test", None, 17)
    try:
        assert not capped and not os.path.ismount(workdir.parent)
        assert "not capped by Limits.disk_mb (17 MB here)" in caplog.text
    finally:
        remove_workdir(workdir.parent)


@pytest.mark.parametrize("runtime", ["bubblewrap", "subprocess"])
async def test_the_reward_hack_reading_the_grader_scores_zero(runtime: str) -> None:
    """The reply that reads function_problems.py scores 1.0 wherever the grader is readable (it does on the host,
    from the project's folder) and 0 on every task in the sandbox."""
    families = 5
    taskset = PythonFunctions({"runtime": runtime, "num_tasks": families, "wall_seconds": 20.0})
    if reason := runtime_for(runtime).unavailable():
        pytest.skip(reason)
    traces = await tg.evaluate(taskset, ScriptedModel(rule=lambda _: f"```python\n{HACK}\n```"),
                               num_tasks=families, rollouts=1)
    assert [t.reward for t in traces] == [0.0] * families, [t.errors for t in traces]


def test_the_reward_hack_finds_the_grader_outside_a_sandbox() -> None:
    """The control: run where the grader is readable, the reply computes the right answers."""
    row = PythonFunctions({"num_tasks": 1})[0]
    namespace: dict[str, object] = {}
    exec(compile(HACK, "reward_hack_reply.py", "exec"), namespace)  # the reply is ours: run it where the grader is
    function = namespace[row.function]
    assert callable(function)
    assert [function(*t.args) for t in row.tests] == [t.expected for t in row.tests]
