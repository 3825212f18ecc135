"""Slow: `tracegym rl` trains one real step on a verifiers environment module: vLLM serving the embedded model,
the environment in its env server, its rubric's reward giving the groups their signal, the trainer stepping."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("verifiers")
pytestmark = pytest.mark.slow

ENVIRONMENT = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    words = ["apple", "pear", "plum", "melon", "grape", "lemon"]
    dataset = Dataset.from_list([{"question": f"Say the word {w}.", "answer": w} for w in words])

    def letters(completion, answer) -> float:
        """A partial credit that differs between samples: the answer's letters said, less a length cost."""
        said = completion[-1]["content"].lower()
        return sum(ch in said for ch in answer) / len(answer) - len(said) / 200

    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[letters]))
'''

CONFIG = '''
steps = 1
weight_sync = "merged"
[model]
max_model_len = 1024
client = "chat"
[orchestrator]
tasks_per_step = 2
group_size = 4
max_async_steps = 1
concurrency = 8
[[orchestrator.train.envs]]
id = "verifiers:{path}"
options = {{ split = "train" }}
[orchestrator.train.sampling]
temperature = 1.0
max_tokens = 16
[trainer]
lora_rank = 8
lora_alpha = 16
learning_rate = 5e-4
micro_batch_tokens = 512
'''


def test_one_rl_step_trains_on_a_verifiers_environment(tmp_path):
    environment = tmp_path / "say_word.py"
    environment.write_text(ENVIRONMENT)
    config = tmp_path / "rl.toml"
    config.write_text(CONFIG.format(path=environment))
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(config), "--output-dir", str(tmp_path),
               "--run-id", "r"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = tmp_path / "r"
    trained = [json.loads(line) for line in (run / "trainer_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["version"]) for r in trained] == [(0, 1)]
    traces = [json.loads(line) for line in (run / "traces" / "step-000000.jsonl").read_text().splitlines()]
    assert traces and all(t["rewards"]["letters"]["score"] is not None for t in traces)
    assert all(t["metrics"]["num_turns"] == 1.0 for t in traces)
