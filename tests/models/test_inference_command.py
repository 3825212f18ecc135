"""`tracegym inference` with a stand-in for vLLM: it prints its endpoint, records the server for `tracegym eval`
to reuse, and SIGTERM or SIGINT (while serving or still starting) leave no process of its group behind."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_fakes import INFERENCE_WITH, NEVER_HEALTHY, POLITE_FAKE_VLLM, wait_until

from tracegym.models import vllm_server
from tracegym.models.launch import serve, server_config, server_record_path
from tracegym.models.model_choice import ModelChoice
from tracegym.runtimes.processes import group_members


class Inference:
    """A running `tracegym inference -m <dir> --port 0` whose vLLM is `script`; its output read line by line."""

    def __init__(self, tmp_path: Path, script: str) -> None:
        self.model_dir = tmp_path / "my-model"
        self.model_dir.mkdir(exist_ok=True)
        self.pid_dir = tmp_path / "pids"
        self.pid_dir.mkdir(exist_ok=True)
        env = {**os.environ, "TRACEGYM_CACHE": str(tmp_path / "cache")}
        command = [sys.executable, "-c", INFERENCE_WITH, script, str(self.pid_dir), "-m", str(self.model_dir),
                   "--port", "0"]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_line(self, prefix: str, timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no {prefix!r} line; output so far:\n{''.join(self.seen)}")

    def group(self) -> int:
        """The server's process group (its supervisor's pid), found through the stand-in's pid file."""
        assert wait_until(lambda: any(self.pid_dir.glob("engine-*.pid")), 20), "the stand-in never started"
        pid_file = next(self.pid_dir.glob("engine-*.pid"))
        assert wait_until(lambda: pid_file.read_text().strip().isdigit(), 5)
        return os.getpgid(int(pid_file.read_text()))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def inference(tmp_path: Path) -> Iterator[Inference]:
    started = Inference(tmp_path, POLITE_FAKE_VLLM)  # the SIGKILL sweep is tested in test_vllm_server
    yield started
    started.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_inference_prints_its_endpoint_and_a_signal_stops_the_whole_group(inference: Inference, signum: int) -> None:
    base_url = inference.wait_for_line("endpoint:").split()[1]
    assert base_url.startswith("http://127.0.0.1:") and vllm_server.serves_model(base_url, "my-model")
    pgid = inference.group()
    inference.proc.send_signal(signum)
    assert inference.proc.wait(30) == 0
    assert wait_until(lambda: not group_members(pgid), 10), f"left behind: {group_members(pgid)}"


def test_sigterm_while_vllm_is_starting_stops_it_promptly(tmp_path: Path) -> None:
    starting = Inference(tmp_path, NEVER_HEALTHY)  # would wait 300 s for health
    try:
        starting.wait_for_line("starting vLLM")
        pgid = starting.group()
        sent = time.monotonic()
        starting.proc.send_signal(signal.SIGTERM)
        assert starting.proc.wait(30) != 0
        assert time.monotonic() - sent < 10
        assert wait_until(lambda: not group_members(pgid), 10), f"left behind: {group_members(pgid)}"
    finally:
        starting.stop()


def test_eval_reuses_the_server_inference_runs(inference: Inference, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    base_url = inference.wait_for_line("endpoint:").split()[1]
    monkeypatch.setenv("TRACEGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vllm_server, "server_command", lambda *_: [sys.executable, "-c", "raise SystemExit(3)"])
    choice = ModelChoice(name=str(inference.model_dir))
    assert server_record_path(server_config(choice)).is_file()
    with serve(choice) as endpoint:  # starting a server of its own would fail (exit code 3)
        assert (endpoint.base_url, endpoint.model) == (base_url, "my-model")
    assert vllm_server.serves_model(base_url, "my-model")  # the reuser left it running
    inference.proc.send_signal(signal.SIGTERM)
    assert inference.proc.wait(30) == 0
    assert not server_record_path(server_config(choice)).exists()
