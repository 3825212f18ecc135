"""Slow: the real `tracegym eval` command on the embedded model served by a vLLM it starts itself."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_eval_command_on_the_embedded_model_end_to_end(tmp_path):
    command = [sys.executable, "-m", "tracegym.cli.main", "eval", "reverse-text", "-n", "3", "-r", "2",
               "--sampling.max-tokens", "32", "--output-dir", str(tmp_path), "--no-rich"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = list(tmp_path.glob("reverse-text--SmolLM2-135M-Instruct/*"))
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 6 and all(not t["errors"] for t in traces)
    replies = [t["graph"]["nodes"][-1] for t in traces]
    assert all(r["sampled"] and r["token_ids"] and r["logprobs"] for r in replies)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_traces"] == 6 and summary["reward"] is not None
    assert "Application startup complete" in (run / "logs" / "vllm.log").read_text()
