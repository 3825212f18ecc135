"""Slow: a real `tracegym rl` (vLLM, env servers, orchestrator, trainer) whose vLLM stops answering mid-run (its
processes stopped with SIGSTOP: they accept requests and never reply) ends within the env server's watchdog budget,
exit 5 with one line naming the stage, and leaves no process behind (the stopped vLLM is killed)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracegym.runtimes.processes import descendants, process_alive
from tracegym.runtimes.watchdog import STALLED_EXIT, Stage, progress_file

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def wait_until(condition, what: str, timeout: float = 600.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)
    return value


def vllm_group(launcher: int) -> int | None:
    """The process group of the vLLM server the launcher started (None until it runs)."""
    for pid in descendants(launcher):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in command:
            return os.getpgid(pid)
    return None


def test_a_run_whose_vllm_stops_answering_stops_naming_the_env_server_and_leaves_no_process(tmp_path):
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", "2",
               "--orchestrator.tasks-per-step", "2", "--orchestrator.eval.num-tasks", "2",
               "--watchdog.env-server", "30", "--watchdog.warn-after", "10",
               "--output-dir", str(tmp_path), "--run-id", "r"]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = tmp_path / "r" / "logs"
    try:
        wait_until(lambda: progress_file(logs, "orchestrator").read().get("stages", {}).get(Stage.ENV_SERVER.value),
                   "the orchestrator's first env-server request")
        group = wait_until(lambda: vllm_group(launcher.pid), "vLLM's process")
        started = descendants(launcher.pid)
        os.killpg(group, signal.SIGSTOP)
        out, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == STALLED_EXIT, out[-3000:]
    [cause] = [line for line in out.splitlines() if line.startswith("rl: stopping everything")]
    assert "orchestrator: no progress in env server" in cause and "(hard budget 30 s)" in cause
    assert "rl: watchdog: orchestrator: no progress in env server" in out  # warned at 10 s first
    wait_until(lambda: not any(process_alive(pid) for pid in started), "every process of the run to end", 10)
