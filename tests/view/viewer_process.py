"""Viewer process: `tracegym view RUN_DIR --port N` started as a user starts it, on a free loopback port, waited for
until it answers, and stopped (its process group) when done."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from process_group import stop_group

START_TIMEOUT = 60.0
"""Seconds for the viewer to import, index the folder and answer (a cold start on a busy 2-core machine)."""


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def viewer(run: Path, log: Path) -> Iterator[str]:
    """The base URL of `tracegym view run` while it runs; its output goes to `log` (shown when it fails)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tracegym.cli.main", "view", str(run), "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_answering(url, process, log)
            yield url
        finally:
            stop_group(process, signal.SIGINT)  # Ctrl-C, as a user stops it


def _wait_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tracegym view exited {process.returncode} at start: {_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers (a 4xx page is an answer)
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"tracegym view did not answer at {url} within {START_TIMEOUT:.0f}s: {_tail(log)}")


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").splitlines()[-8:])
