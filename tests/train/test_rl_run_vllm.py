"""Slow: `tracegym rl` for two real steps on the embedded model: vLLM, env servers, orchestrator, trainer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def test_two_rl_steps_train_the_adapter_and_vllm_serves_it(tmp_path):
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", "2",
               "--orchestrator.tasks-per-step", "2", "--orchestrator.eval.num-tasks", "4",
               "--output-dir", str(tmp_path), "--run-id", "r"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    run = tmp_path / "r"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((run / "policy.json").read_text()) == {"version": 2, "model": "policy"}
    adapter = load_file(str(run / "weights" / "current" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in adapter.items())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_reward" in r]
    assert [(r["eval_step"], r["policy_version"]) for r in evals] == [(0, 0), (2, 2)]  # the last one ran on "policy"
    assert (run / "checkpoints" / "step-000002" / "DONE").is_file()
