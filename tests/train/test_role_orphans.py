"""RL roles exit when their launcher dies without stopping them (kill -9)."""

import signal
import subprocess
import sys
import time

from tracegym.runtimes.processes import process_alive

CHILD = """
import os, time
from tracegym.train.roles import exit_with_parent
exit_with_parent(os.getppid(), every_s=0.1)
print(os.getpid(), flush=True)
time.sleep(60)
"""
PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=sys.stdout)
time.sleep(60)
"""


def test_a_role_exits_soon_after_its_launcher_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert process_alive(child)
    assert_exits_once_killed(parent, child)


def assert_exits_once_killed(launcher: subprocess.Popen, role: int) -> None:
    """Kill `launcher` with -9; `role` must be gone within 10 s."""
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while process_alive(role) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(role)


RANK = """
import os, time
from tracegym.train.roles import LAUNCHER_PID_ENV, exit_with_parent
exit_with_parent(int(os.environ[LAUNCHER_PID_ENV]), every_s=0.1)
print(os.getpid(), flush=True)
time.sleep(60)
"""
AGENT = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {RANK!r}], stdout=sys.stdout)
time.sleep(60)
"""
LAUNCHER = f"""
import os, subprocess, sys, time
from tracegym.train.roles import LAUNCHER_PID_ENV
subprocess.Popen([sys.executable, "-c", {AGENT!r}], stdout=sys.stdout,
                 env={{**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}})
time.sleep(60)
"""


def test_a_trainer_rank_under_torchrun_exits_soon_after_the_launcher_is_killed():
    """torchrun's agent (standing in here: a process that outlives the launcher) is the rank's parent; the rank
    watches the launcher above it."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    rank = int(launcher.stdout.readline())
    time.sleep(0.5)
    assert process_alive(rank)  # the launcher is alive: the rank stays
    assert_exits_once_killed(launcher, rank)
