"""Slow: `tracegym rl` for two real steps on the embedded model: vLLM, env servers, orchestrator, trainer."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def _two_steps(tmp_path: Path, *flags: str) -> Path:
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--steps", "2",
               "--orchestrator.tasks-per-step", "2", "--orchestrator.eval.num-tasks", "4",
               "--output-dir", str(tmp_path), "--run-id", "r", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^rl: 2 steps, (\d+ rollouts, all scored|\d+ of \d+ rollouts scored)", done.stdout, re.M), \
        done.stdout[-2000:]  # the run's headline (`train.run_tally`)
    return tmp_path / "r"


def test_two_rl_steps_train_the_adapter_and_vllm_serves_it(tmp_path):
    run = _two_steps(tmp_path, "--weight-sync", "lora")
    assert json.loads((run / "policy.json").read_text()) == {"version": 2, "model": "policy"}
    adapter = load_file(str(run / "weights" / "current" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in adapter.items())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_reward" in r]
    assert [(r["eval_step"], r["policy_version"]) for r in evals] == [(0, 0), (2, 2)]  # the last one ran on "policy"
    assert (run / "checkpoints" / "step-000002" / "DONE").is_file()
    replayed = subprocess.run([sys.executable, "-m", "tracegym.cli.main", "rl", "--replay", str(run), "--step", "1"],
                              capture_output=True, text=True, timeout=600)
    assert replayed.returncode == 0 and "bit for bit" in replayed.stdout, replayed.stdout + replayed.stderr[-2000:]


def test_two_rl_steps_with_merged_sync_have_vllm_merge_each_adapter_in_place(tmp_path):
    run = _two_steps(tmp_path)  # the shipped config syncs merged weights
    policy = json.loads((run / "policy.json").read_text())
    assert policy["version"] == 2 and policy["model"] != "policy"  # requests keep naming the base model
    assert (run / "weights" / "merged" / "model.safetensors").is_file()  # whole, at the last checkpoint
    assert (run / "weights" / "current" / "adapter_config.json").is_file()  # what vLLM merged at each step
    assert not (run / "weights" / "changed").exists()  # no merged-weights file per step
    trained = [json.loads(line) for line in (run / "trainer_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["version"]) for r in trained] == [(0, 1), (1, 2)]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_reward" in r]
    assert [(r["eval_step"], r["policy_version"]) for r in evals] == [(0, 0), (2, 2)]
