"""Slow: `tracegym eval A B` on the embedded model: one vLLM server, started once for both tasksets."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_several_tasksets_share_one_vllm_server_the_command_starts(tmp_path):
    command = [sys.executable, "-m", "tracegym.cli.main", "eval", "reverse-text", "arithmetic", "-n", "2",
               "--sampling.max-tokens", "16", "--output-dir", str(tmp_path), "--no-rich"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = list(tmp_path.glob("reverse-text_arithmetic--SmolLM2-135M-Instruct/*"))
    assert "Application startup complete" in (run / "logs" / "vllm.log").read_text()
    assert not list(run.glob("*/logs/vllm.log"))  # no taskset started a server of its own
    summary = json.loads((run / "summary.json").read_text())
    assert [(t["name"], t["total"]) for t in summary["tasksets"]] == [("reverse-text", 2), ("arithmetic", 2)]
