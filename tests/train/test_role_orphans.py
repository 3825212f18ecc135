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
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(child)
