"""Helpers for the runtimes tests: a process only SIGKILL ends, and a polling wait."""

from __future__ import annotations

import time
from collections.abc import Callable

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
           "time.sleep(60)"
"""A process that ignores SIGTERM (as vLLM's engine core may): only SIGKILL ends it. It prints `ready` first."""


def wait_until(condition: Callable[[], bool], timeout_s: float = 10) -> bool:
    """Poll `condition`; True as soon as it holds, else its value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
