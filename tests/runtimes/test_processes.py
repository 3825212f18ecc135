"""Processes: a group leader and its grandchild stopped together, terminate-then-kill with a grace period, and
children that exit when their parent dies (kernel signal and parent watch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from runtime_helpers import STUBBORN, wait_until

from tracegym.runtimes.processes import (
    Parent,
    group_members,
    process_alive,
    spawn_group,
    stop,
    stop_all,
)

# A child that starts a stubborn grandchild, prints the grandchild's pid, and waits.
WITH_GRANDCHILD = f"""
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], stdout=subprocess.PIPE)
grandchild.stdout.readline()
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def test_stopping_a_group_stops_the_child_and_its_grandchild():
    proc = spawn_group([sys.executable, "-c", WITH_GRANDCHILD], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    assert os.getpgid(proc.pid) == proc.pid and os.getpgid(grandchild) == proc.pid
    assert sorted(group_members(proc.pid)) == sorted([proc.pid, grandchild])
    started = time.monotonic()
    assert stop(proc, 0.5, group=True) == -signal.SIGTERM
    assert time.monotonic() - started < 30  # not the grandchild's 60 s
    assert wait_until(lambda: not process_alive(grandchild))  # it ignored SIGTERM: the group's SIGKILL got it
    assert group_members(proc.pid) == []
    proc.stdout.close()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    started = time.monotonic()
    assert stop(proc, 0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 30  # the grace period, then SIGKILL: not its 60 s
    proc.stdout.close()


def test_stop_all_shares_one_grace_period_and_reaps_everything():
    polite = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    started = time.monotonic()
    stop_all([*polite, stubborn], 1.0)
    assert time.monotonic() - started < 30  # one grace period for all (not one each), never their 60 s
    assert [p.returncode for p in polite] == [-signal.SIGTERM] * 2 and stubborn.returncode == -signal.SIGKILL
    stubborn.stdout.close()


def test_stopping_a_process_that_already_exited_is_no_error():
    proc = spawn_group([sys.executable, "-c", "raise SystemExit(4)"])
    proc.wait()
    assert stop(proc, 0.1, group=True) == 4
    assert stop(proc, 0.1) == 4


# Run as a group leader: starts a stubborn grandchild, then sweeps its own group and says whether it survived.
SWEEPER = f"""
import subprocess, sys
from tracegym.runtimes.processes import process_alive, stop_rest_of_group
grandchild = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], stdout=subprocess.PIPE)
grandchild.stdout.readline()
stop_rest_of_group(0.3)
grandchild.wait()
print(process_alive(grandchild.pid), grandchild.returncode, flush=True)
"""


def test_a_group_leader_sweeps_the_rest_of_its_group_and_survives():
    proc = spawn_group([sys.executable, "-c", SWEEPER], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and out.split() == [b"False", str(-signal.SIGKILL).encode()]


def test_parent_is_alive_while_it_is_our_parent():
    assert Parent().alive() and Parent().pid == os.getppid()
    assert not Parent(pid=os.getpid()).alive()


def test_process_alive_is_false_for_a_reaped_process():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_alive(os.getpid()) and not process_alive(proc.pid)


# A parent that starts CHILD (which prints its pid) and then waits to be killed.
def orphaning(child: str) -> str:
    return f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {child!r}], stdout=sys.stdout)
time.sleep(60)
"""


DIES_WITH_PARENT = """
import os, time
from tracegym.runtimes.processes import die_with_parent
die_with_parent(every_s=60)  # a watch this slow leaves the kernel's signal to do it
print(os.getpid(), flush=True)
time.sleep(60)
"""

WATCHES_PARENT = """
import os, time
from tracegym.runtimes.processes import watch_parent
watch_parent(lambda: os._exit(7), every_s=0.1)
print(os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("child", [DIES_WITH_PARENT, WATCHES_PARENT], ids=["kernel-signal", "parent-watch"])
def test_a_child_whose_parent_is_killed_exits(child: str):
    parent = subprocess.Popen([sys.executable, "-c", orphaning(child)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    assert process_alive(pid)
    parent.kill()
    parent.wait()
    assert wait_until(lambda: not process_alive(pid), 5)
    parent.stdout.close()
