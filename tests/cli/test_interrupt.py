"""A command's SIGTERM unwinds like Ctrl-C; with `once`, later signals cannot cut that unwinding short."""

import subprocess
import sys

import pytest

PROGRAM = """
import os, signal, sys, time
from tracegym.cli.interrupt import sigterm_unwinds
sigterm_unwinds(once=sys.argv[1] == "once")
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except KeyboardInterrupt:
    print("unwound", flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # ignored with `once`, else Ctrl-C's own KeyboardInterrupt
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("stopped cleanly", flush=True)
"""


@pytest.mark.parametrize(("mode", "lines"), [("once", ["unwound", "stopped cleanly"]), ("every", ["unwound"])])
def test_sigterm_raises_keyboard_interrupt(mode, lines):
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=20)
    assert done.stdout.split("\n")[:-1] == lines
    assert (done.returncode == 0) == (mode == "once")
