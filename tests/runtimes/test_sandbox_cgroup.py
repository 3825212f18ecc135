"""A sandbox's cgroup: the memory and the processes of all its programs capped together, per runtime (where this
host lets us make one: here, as root on cgroup v1), the cap that fired reported, nothing left after close, and the
cgroups of a dead owner removed; where none can be made, the result and the log say memory is capped per process."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import QUICK, runtimes

from tracegym.runtimes import cgroup as cgroups
from tracegym.runtimes.cgroup import Placement, SandboxCgroup, locate, placement, remove_abandoned_cgroups
from tracegym.runtimes.limited_process import LimitedProcess
from tracegym.runtimes.process_sandbox import ProcessSandbox
from tracegym.runtimes.sandbox import Limits, Runtime

PY = "python3"
AUDIT = Limits(wall_seconds=60, cpu_seconds=60, memory_mb=512, processes=16, output_bytes=10_000, disk_mb=16)
"""The outside audit's limits: 6 children of one sandbox held 2.47 GB under them, before cgroups."""
SIX_HOLDERS = """
import os, sys, time
children = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        held = bytearray(400 << 20)  # zeroed: every page touched
        time.sleep(2)
        os._exit(0)
    children.append(pid)
failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in children)
print(failed, "children failed")
sys.exit(1 if failed else 0)
"""
FORK_BOMB = "import os, sys\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        sys.exit(1)"
needs_cgroups = pytest.mark.skipif(isinstance(placement(), str), reason=f"no cgroup here: {placement()}")


def kind_of(runtime: Runtime, limits: Limits) -> Runtime:
    """A runtime of `runtime`'s kind (and isolation) under `limits`."""
    if isinstance(runtime, LimitedProcess):
        return LimitedProcess(limits, isolation=runtime.isolation)
    return type(runtime)(limits)  # type: ignore[call-arg]


@pytest.fixture(params=[p for p in runtimes() if p.id != "container"])
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[ProcessSandbox]:
    """A sandbox with a cgroup under the audit's limits; after the test, none of its cgroup is left."""
    box = await kind_of(request.param, AUDIT).open()
    assert isinstance(box, ProcessSandbox)
    try:
        assert box.cgroup is not None, f"no cgroup: {placement()}"
        yield box
    finally:
        folders = box.cgroup.folders if box.cgroup is not None else []
        await box.close()
        assert not [folder for folder in folders if folder.exists()], "the sandbox's cgroup outlived its close"


@needs_cgroups
@pytest.mark.slow  # the kernel reclaims for seconds before each OOM kill
async def test_six_children_holding_400_mb_each_end_at_the_sandboxs_memory_cap(sandbox: ProcessSandbox) -> None:
    result = await sandbox.run([PY, "-c", SIX_HOLDERS])
    assert result.limit == "memory" and result.memory_scope == "sandbox", result
    assert sandbox.cgroup is not None
    peak = sandbox.cgroup.peak_bytes()
    assert peak is not None and peak <= AUDIT.memory_mb << 20, f"the sandbox held {peak >> 20} MB at once"


@needs_cgroups
async def test_one_memory_hog_is_killed_at_the_cap_and_reported_as_memory(sandbox: ProcessSandbox) -> None:
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(10_000_000))"
    result = await sandbox.run([PY, "-c", hog], limits=AUDIT.model_copy(update={"memory_mb": 128}))
    assert result.limit == "memory" and result.signal == 9, result  # OOM-killed: no RLIMIT_AS under a cgroup
    after = await sandbox.run([PY, "-c", "print(6 * 7)"])
    assert after.ok and after.stdout.strip() == "42", after


@needs_cgroups
async def test_a_fork_bomb_ends_at_the_sandboxs_processes_cap(sandbox: ProcessSandbox) -> None:
    result = await sandbox.run([PY, "-c", FORK_BOMB])
    assert result.limit == "processes", result
    assert sandbox.cgroup is not None
    peak = (sandbox.cgroup.pids / "pids.peak").read_text().strip()
    assert int(peak) <= AUDIT.processes


@needs_cgroups
async def test_the_program_starts_inside_its_cgroup_and_cannot_move_out(sandbox: ProcessSandbox) -> None:
    assert sandbox.cgroup is not None
    out_of_it = sandbox.cgroup.pids.parent / "cgroup.procs"
    program = (f"import os\nprint(open('/proc/self/cgroup').read())\ntry:\n"
               f"    open({str(out_of_it)!r}, 'w').write(str(os.getpid()))\n    print('MOVED OUT')\n"
               f"except OSError as exc:\n    print('refused:', exc)\n"
               f"print(open('/proc/self/cgroup').read())")
    result = await sandbox.run([PY, "-c", program])
    assert result.ok, result
    assert "refused:" in result.stdout and "MOVED OUT" not in result.stdout
    name = f"tracegym-sandbox-{sandbox.id}"
    lines = [line for line in result.stdout.splitlines() if ":memory:" in line or ":pids:" in line]
    assert len(lines) == 4 and all(line.endswith(name) for line in lines), result.stdout


@needs_cgroups
async def test_close_removes_the_cgroup_with_a_daemon_still_in_it(sandbox: ProcessSandbox) -> None:
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    await sandbox.run([PY, "-c", daemon])
    assert sandbox.cgroup is not None
    folders = sandbox.cgroup.folders
    await sandbox.close()
    assert not [folder for folder in folders if folder.exists()]


@needs_cgroups
def test_an_abandoned_cgroup_is_removed_with_what_is_in_it() -> None:
    where = placement()
    assert isinstance(where, Placement)
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names the dead owner
    abandoned = SandboxCgroup.make(where, f"{gone.pid}-abandoned", 64, 4)
    fds = abandoned.entry_fds()
    enter = f"import os, time\nfor fd in {fds}:\n    os.write(fd, b'0')\nprint('in', flush=True)\ntime.sleep(60)"
    inside = subprocess.Popen([PY, "-c", enter], pass_fds=fds, stdout=subprocess.PIPE)
    for fd in fds:
        os.close(fd)
    try:
        assert inside.stdout is not None and inside.stdout.readline() == b"in\n"
        assert inside.pid in abandoned.members()
        remove_abandoned_cgroups.cache_clear()
        removed = remove_abandoned_cgroups()
        assert set(abandoned.folders) <= set(removed) and not any(f.exists() for f in abandoned.folders)
        assert inside.wait(timeout=10) == -9
    finally:
        inside.kill()
        inside.wait()
        abandoned.remove()


async def test_without_a_cgroup_the_result_and_one_warning_say_memory_is_per_process(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cgroups, "placement", lambda: "no cgroup in this test")
    caplog.set_level(logging.WARNING)
    boxes = [await LimitedProcess(QUICK).open() for _ in range(2)]
    try:
        assert all(isinstance(box, ProcessSandbox) and box.cgroup is None for box in boxes)
        hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(10_000_000))"
        result = await boxes[0].run([PY, "-c", hog])
        assert result.memory_scope == "process" and result.limit == "memory" and "MemoryError" in result.stderr
    finally:
        for box in boxes:
            await box.close()
    said = [r.getMessage() for r in caplog.records if "no cgroup in this test" in r.getMessage()]
    assert len(said) == 1 and "memory_mb" in said[0] and "processes" in said[0] and "per process" in said[0]


# --- where cgroups are made -----------------------------------------------------------------------------------
def test_v1_cgroups_are_made_under_our_own_memory_and_pids_cgroups(tmp_path: Path) -> None:
    (tmp_path / "memory" / "jobs" / "ours").mkdir(parents=True)
    (tmp_path / "pids").mkdir()
    mounts = (f"35 31 0:32 / {tmp_path}/memory rw,relatime - cgroup cgroup rw,memory\n"
              f"39 31 0:36 / {tmp_path}/pids rw,relatime - cgroup cgroup rw,pids\n"
              f"41 31 0:38 / {tmp_path}/unified rw,relatime - cgroup2 cgroup2 rw")
    where = locate("8:pids:/\n4:memory:/jobs/ours\n0::/", mounts)
    assert where == Placement(1, tmp_path / "memory" / "jobs" / "ours", tmp_path / "pids")


def test_a_cgroup_the_mounts_do_not_show_is_no_place(tmp_path: Path) -> None:
    mounts = f"41 31 0:38 /elsewhere {tmp_path} rw - cgroup2 cgroup2 rw"
    assert isinstance(locate("0::/ours", mounts), str)


def fake_v2(tmp_path: Path, enabled: str) -> Path:
    """A cgroup2 tree: `svc` (controllers memory and pids, `enabled` for its children) holding our leaf."""
    parent = tmp_path / "svc"
    (parent / "leaf").mkdir(parents=True)
    (parent / "cgroup.controllers").write_text("cpu memory pids\n")
    (parent / "cgroup.subtree_control").write_text(enabled)
    (parent / "cgroup.procs").write_text("")
    return parent


def test_v2_cgroups_are_made_beside_ours_in_the_delegated_parent(tmp_path: Path) -> None:
    parent = fake_v2(tmp_path, "")
    where = locate("0::/svc/leaf", f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw")
    assert where == Placement(2, parent, parent)
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"  # given to its children


def test_a_v2_cgroup_is_capped_with_no_swap(tmp_path: Path) -> None:
    parent = fake_v2(tmp_path, "memory pids")
    made = SandboxCgroup.make(Placement(2, parent, parent), "1-x", 300, 20)
    folder = parent / "tracegym-sandbox-1-x"
    assert made.folders == [folder]
    assert [(folder / name).read_text() for name in ("memory.max", "memory.swap.max", "pids.max")] == [
        str(300 << 20), "0", "20"]


def test_v1_caps_memory_and_memory_plus_swap_alike(tmp_path: Path) -> None:
    made = SandboxCgroup(1, tmp_path, tmp_path)
    made.cap(100, 8)
    made.cap(200, 8)
    assert (tmp_path / "memory.memsw.limit_in_bytes").read_text() == str(200 << 20)
    assert (tmp_path / "memory.limit_in_bytes").read_text() == str(200 << 20)


def test_the_fired_caps_are_read_from_the_counts() -> None:
    before = cgroups.Counts(oom_kills=1, forks_refused=0)
    assert cgroups.Counts(oom_kills=2, forks_refused=3).fired_since(before) == ["memory", "processes"]
    assert before.fired_since(before) == []



def fake_v1(tmp_path: Path) -> str:
    """Mounts of cgroup v1's memory and pids hierarchies in `tmp_path`, each with a `tracegym-alice` folder."""
    for controller in ("memory", "pids"):
        (tmp_path / controller / "tracegym-alice").mkdir(parents=True)
    return (f"35 31 0:32 / {tmp_path}/memory rw,relatime - cgroup cgroup rw,memory\n"
            f"39 31 0:36 / {tmp_path}/pids rw,relatime - cgroup cgroup rw,pids")


def test_v1_cgroups_are_made_under_the_delegated_cgroup_named(tmp_path: Path) -> None:
    where = locate("8:pids:/\n4:memory:/jobs/ours\n0::/", fake_v1(tmp_path), "/tracegym-alice")
    assert where == Placement(1, tmp_path / "memory" / "tracegym-alice", tmp_path / "pids" / "tracegym-alice")


def test_a_delegated_v1_cgroup_missing_from_a_hierarchy_is_refused_naming_the_setting(tmp_path: Path) -> None:
    mounts = fake_v1(tmp_path)
    (tmp_path / "pids" / "tracegym-alice").rmdir()
    why = locate("8:pids:/\n4:memory:/\n0::/", mounts, "/tracegym-alice")
    assert isinstance(why, str) and "TRACEGYM_CGROUP=/tracegym-alice" in why


def test_v2_cgroups_are_made_in_the_delegated_cgroup_holding_us(tmp_path: Path) -> None:
    parent = fake_v2(tmp_path, "")
    where = locate("0::/svc/leaf", f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw", "/svc")
    assert where == Placement(2, parent, parent)
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"


@pytest.mark.parametrize("ours", ["/svc", "/elsewhere"])
def test_a_delegated_v2_cgroup_not_strictly_above_us_is_refused_saying_why(tmp_path: Path, ours: str) -> None:
    fake_v2(tmp_path, "")
    (tmp_path / "elsewhere").mkdir()
    why = locate(f"0::{ours}", f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw", "/svc")
    assert isinstance(why, str) and "TRACEGYM_CGROUP=/svc" in why and "child of it" in why
