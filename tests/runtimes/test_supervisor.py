"""The supervisor: its command's exit, a stop request or its owner's death each leave nothing of its group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from runtime_helpers import STUBBORN, wait_until

from tracegym.runtimes import supervisor
from tracegym.runtimes.processes import group_members, process_alive, spawn_group

# A command that starts a stubborn grandchild (which outlives it), prints the grandchild's pid, then sleeps
# `sys.argv[1]` seconds and exits with code 5.
COMMAND = f"""
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], stdout=subprocess.PIPE)
grandchild.stdout.readline()
print(grandchild.pid, flush=True)
time.sleep(float(sys.argv[1]))
sys.exit(5)
"""


def supervise(parent: int, sleep_s: float) -> tuple[subprocess.Popen[bytes], int]:
    """A supervisor of COMMAND, and the pid of its stubborn grandchild."""
    proc = spawn_group(supervisor.command(parent, 0.3, [sys.executable, "-c", COMMAND, str(sleep_s)]),
                       stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_the_command_line_runs_the_module():
    cmd = supervisor.command(123, 2.5, ["vllm", "--port", "1"])
    assert cmd[1:3] == ["-m", "tracegym.runtimes.supervisor"] and cmd[-4:] == ["--", "vllm", "--port", "1"]


def test_when_the_command_exits_the_rest_of_the_group_is_stopped_and_its_code_returned():
    proc, grandchild = supervise(parent=os.getpid(), sleep_s=0)
    assert proc.wait(20) == 5
    assert not process_alive(grandchild) and group_members(proc.pid) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_request_stops_the_command_and_the_group(signum: int):
    proc, grandchild = supervise(parent=os.getpid(), sleep_s=60)
    started = time.monotonic()
    proc.send_signal(signum)  # to the supervisor alone, not its group
    proc.wait(30)
    assert time.monotonic() - started < 30  # not the command's 60 s
    assert not process_alive(grandchild) and group_members(proc.pid) == []


# An owner that starts a supervisor (printing its pid and its grandchild's) and waits to be killed.
OWNER = f"""
import os, subprocess, sys, time
from tracegym.runtimes import supervisor
from tracegym.runtimes.processes import spawn_group
proc = spawn_group(supervisor.command(os.getpid(), 0.3, [sys.executable, "-c", {COMMAND!r}, "60"]),
                   stdout=subprocess.PIPE)
print(proc.pid, proc.stdout.readline().decode().strip(), flush=True)
time.sleep(60)
"""


def test_when_the_owner_is_killed_the_group_is_stopped():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pgid, grandchild = map(int, owner.stdout.readline().split())
    assert len(group_members(pgid)) == 3
    owner.kill()
    owner.wait()
    assert wait_until(lambda: not group_members(pgid), 10), group_members(pgid)
    assert not process_alive(grandchild)
    owner.stdout.close()


def test_a_command_line_without_a_command_is_refused():
    done = subprocess.run([sys.executable, "-m", "tracegym.runtimes.supervisor", "--parent", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "command" in done.stderr
