"""How a trainer process ends: one rank of several skips the interpreter's shutdown (where gloo's worker threads
could abort it) with its exit status and its output intact; a process alone ends normally."""

import os
import subprocess
import sys

PROGRAM = """
import atexit, sys
from tracegym.train.data_parallel import exit_process
atexit.register(lambda: print("shut down", flush=True))
print("written", end="")  # unflushed: exit_process flushes it
sys.stderr.write("said")
exit_process(3)
"""


def ended(world: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORLD_SIZE": world}
    return subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)


def test_a_rank_of_several_exits_with_its_status_and_output_without_shutting_the_interpreter_down():
    done = ended("2")
    assert (done.returncode, done.stdout, done.stderr) == (3, "written", "said")


def test_a_process_alone_shuts_down_normally():
    done = ended("1")
    assert (done.returncode, done.stdout) == (3, "written" + "shut down\n")
