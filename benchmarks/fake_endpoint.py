"""Fake endpoint: the fake OpenAI server in its own process, so a benchmark's client and server share no GIL."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

_SERVE = """
import sys, time
from tracegym.testing import FakeOpenAIServer
server = FakeOpenAIServer(rule=lambda r: "The quick brown fox jumps over the lazy dog.", latency=float(sys.argv[1]))
server.start()
print(server.port, flush=True)
sys.stdin.read()  # until the parent closes our stdin (or dies)
"""


@contextlib.contextmanager
def fake_endpoint(latency: float = 0.0) -> Iterator[str]:
    """Base URL of a fake OpenAI server in a child process, stopped on exit."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(latency)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.kill()
        proc.wait()
