"""Stand-ins for vLLM shared by the server-manager and `tracegym inference` tests, and a polling helper."""

from __future__ import annotations

import time
from collections.abc import Callable

# A stand-in for vLLM: answers /health and /v1/models, and starts a child that, like vLLM's engine core,
# ignores SIGTERM and outlives its parent; so only the supervisor's group sweep and SIGKILL can end it.
FAKE_VLLM = r"""
import http.server, json, subprocess, sys
port, name, pid_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
engine = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", engine])
with open(pid_file, "w") as f:
    f.write(str(child.pid))

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/health": b"", "/v1/models": json.dumps({"data": [{"id": name}]}).encode()}.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# The same, but its engine child stops on SIGTERM (no wait for the supervisor's SIGKILL grace period).
POLITE_FAKE_VLLM = FAKE_VLLM.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN); ", "")
assert POLITE_FAKE_VLLM != FAKE_VLLM

# A stand-in for a vLLM that never becomes healthy: it records its pid (same arguments as FAKE_VLLM) and sleeps.
NEVER_HEALTHY = "import os, sys, time; open(sys.argv[3], 'w').write(str(os.getpid())); time.sleep(600)"

# `tracegym inference ARGS...` with vLLM's command line replaced by a stand-in script:
# python -c INFERENCE_WITH <script> <pid folder> ARGS...; the stand-in writes <pid folder>/engine-<port>.pid.
INFERENCE_WITH = r"""
import sys
from tracegym.models import vllm_server
script, pid_dir = sys.argv[1], sys.argv[2]
def command(config, port):
    return [sys.executable, "-c", script, str(port), config.name, f"{pid_dir}/engine-{port}.pid"]
vllm_server.server_command = command
from tracegym.cli.main import main
sys.exit(main(["inference", *sys.argv[3:]]))
"""


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` every 0.1 s; True as soon as it holds, False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False
