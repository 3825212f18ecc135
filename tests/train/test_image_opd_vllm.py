"""Slow: `tracegym rl` for one real `opd` step of the embedded VLM on colour-codeword: vLLM serving the student, the
token client sending the pictures, and the same VLM as the teacher, loaded in the orchestrator's process
(`[opd] scorer = "transformers"`) and scoring the student's tokens with the pictures in their runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracegym.models.embedded_vlm import embedded_vlm_dir
from tracegym.train.rl_folder import RLFolder

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs" / "rl" / "colour_codeword_vlm.toml"
SMALLEST = ["--steps", "1", "--orchestrator.tasks-per-step", "2", "--orchestrator.group-size", "2",
            "--orchestrator.eval.num-tasks", "1", "--orchestrator.train.sampling.max-tokens", "6",
            "--orchestrator.eval.sampling.max-tokens", "2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("opd")
    vlm = str(embedded_vlm_dir())
    command = [sys.executable, "-m", "tracegym.cli.main", "rl", "@", str(CONFIG), "--model.name", vlm,
               "--mode", "opd", "--teacher.name", vlm, "--opd.scorer", "transformers", *SMALLEST,
               "--output-dir", str(out), "--run-id", "r"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out / "r"


def test_every_sampled_token_of_the_image_samples_gets_the_teachers_advantage(run):
    samples = RLFolder(run).read_batch(0).samples
    assert samples and all(len(s.images) == 1 for s in samples)
    assert all(len(s.token_advantages) == len(s) for s in samples)


def test_the_teacher_with_the_pictures_agrees_with_itself_as_the_student(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in records if "opd/kl" in r]
    assert step["opd/tokens"] > 0 and abs(step["opd/kl"]) < 0.1, step  # the teacher is the student (bf16 vs fp32)
