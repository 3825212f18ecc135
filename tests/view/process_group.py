"""Process group: a child the browser tests start in its own session (Chromium, `tracegym view`), stopped whole."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_group(process: subprocess.Popen[bytes], first: signal.Signals = signal.SIGTERM, grace: float = 5.0) -> None:
    """Send `first` to the child's process group, then SIGKILL if it is still there after `grace` seconds; waits
    for the child either way (so none is left behind, whatever happened in the test)."""
    for sig in (first, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue
