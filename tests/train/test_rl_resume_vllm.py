"""Slow: `tracegym rl` killed with -9 after a checkpoint leaves no process behind, and `--resume` finishes the
run from that checkpoint on the embedded model (vLLM, env servers, orchestrator and trainer all real)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracegym.runtimes.processes import process_alive

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def rl(tmp_path: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", "3",
            "--checkpoint-every", "1", "--orchestrator.tasks-per-step", "2", "--orchestrator.eval.num-tasks", "4",
            "--output-dir", str(tmp_path), *flags]


def descendants(pid: int) -> set[int]:
    """Every process whose ancestry (by ppid, read from /proc) leads to `pid`, found while it is alive."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.5)
    return bool(condition())


def test_a_run_killed_after_a_checkpoint_leaves_nothing_running_and_resumes_to_the_end(tmp_path):
    run = tmp_path / "r"
    launcher = subprocess.Popen(rl(tmp_path, "--run-id", "r"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: (run / "checkpoints" / "step-000001" / "DONE").is_file(), 600)
        children = descendants(launcher.pid)
        assert len(children) >= 4  # vLLM (under its supervisor), env servers, orchestrator, trainer
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert wait_until(lambda: not any(map(process_alive, children)), 60), list(filter(process_alive, children))

    done = subprocess.run(rl(tmp_path, "--resume", str(run)), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (run / "checkpoints" / "step-000003" / "DONE").is_file()
    assert json.loads((run / "policy.json").read_text())["version"] == 3
    trained = [json.loads(line)["step"] for line in (run / "trainer_metrics.jsonl").read_text().splitlines()]
    assert trained[-1] == 2 and set(trained) == {0, 1, 2}
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval_step"] for r in evals if "eval_reward" in r][-1] == 3
    assert os.listdir(run / "logs")
