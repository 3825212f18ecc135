"""Slow: `tracegym rl` for two real steps of the embedded VLM on colour-codeword: vLLM serving the Idefics3 model
with each new LoRA adapter, the token client sending the pictures, the trainer computing logprobs with them.

The untrained VLM never answers with a code word, so every reward is 0 and no group has a signal; the run takes its
advantages from `alternating` (+1, -1, ... within a group) so that the adapter moves and vLLM must serve it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tracegym.models.embedded_vlm import embedded_vlm_dir
from tracegym.train.rl_folder import RLFolder

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs" / "rl" / "colour_codeword_vlm.toml"
SMALLEST = ["--steps", "2", "--orchestrator.tasks-per-step", "2", "--orchestrator.group-size", "4",
            "--orchestrator.eval.num-tasks", "2", "--orchestrator.train.sampling.max-tokens", "6",
            "--orchestrator.advantage.name", "tests.train.test_image_rl_vllm:alternating",
            "--orchestrator.advantage.filter-no-signal", "false"]


def alternating(rewards: list[float]) -> list[float]:
    """+1, -1, +1, ... whatever the rewards: a signal for a model that earns none yet."""
    return [1.0 - 2.0 * (i % 2) for i in range(len(rewards))]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rl")
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--model.name",
               str(embedded_vlm_dir()), *SMALLEST, "--output-dir", str(out), "--run-id", "r"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)  # the advantage imports
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out / "r"


def test_the_trained_samples_carry_their_pictures_stored_in_the_run_folder(run):
    samples = RLFolder(run).read_batch(0).samples
    assert samples and all(len(s.images) == 1 for s in samples)
    assert all(list((run / "images").glob(f"{s.images[0].sha256}.png")) for s in samples)


def test_vllm_serves_each_new_adapter_of_the_text_tower(run):
    assert json.loads((run / "policy.json").read_text()) == {"version": 2, "model": "policy"}
    adapter = load_file(str(run / "weights" / "current" / "adapter_model.safetensors"))
    assert all(".text_model." in name for name in adapter)
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in adapter.items())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["eval_step"], r["policy_version"]) for r in records if "eval_reward" in r] == [(0, 0), (2, 2)]


def test_the_trainers_logprobs_with_the_pictures_are_close_to_vllms(run):
    trained = [json.loads(line) for line in (run / "trainer_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trained] == [0, 1]
    assert all(r["abs_log_ratio_mean"] < 0.3 for r in trained), trained  # text runs: ~0.17 (rl_reverse_text.md)
