"""The data-parallel trainer under torchrun (2 gloo processes) against one process on the same batches: the same
update, checkpoints that resume at the other world size, and only rank 0 writing and publishing."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tracegym.core.sample import Sample
from tracegym.train.rl_folder import RLFolder

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("dp_worker.py")
FLOAT32 = {"compute_dtype": "float32"}
"""bfloat16 rounds differently when the micro-batches have other shapes (2% of Adam's first-step signs flip on
near-zero gradients), which would hide a real mismatch; in float32 the two runs agree to ~1e-7."""


def batch(step: int, n: int = 24) -> list[Sample]:
    """Reverse-text-sized samples with advantages of both signs: three micro-batches in one process."""
    rng = random.Random(step)
    out = []
    for _ in range(n):
        mask = [False] * rng.randint(8, 30) + [True] * rng.randint(6, 30)
        out.append(Sample(token_ids=[rng.randrange(64) for _ in mask], loss_mask=mask,
                          logprobs=[-4.0 if m else 0.0 for m in mask], advantage=rng.uniform(-1, 1)))
    return out


def run(run_dir: Path, steps: int, kind: str, processes: int, override: dict | None = None,
        resume_from: Path | None = None) -> RLFolder:
    """Train `steps` steps of `kind` (lora / full) in `run_dir` with `processes` trainer processes; with
    `resume_from`, start from a copy of that run's first checkpoint."""
    folder = RLFolder(run_dir)
    run_dir.mkdir(parents=True)
    for step in range(steps):
        folder.write_batch(step, batch(step), state={"step": step})
    if resume_from is not None:
        shutil.copytree(resume_from / "checkpoints" / "step-000001", run_dir / "checkpoints" / "step-000001")
    script = [str(WORKER), str(run_dir), str(steps), kind]
    command = [sys.executable, *script] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *script]
    env = {**os.environ, "DP_OVERRIDE": json.dumps(override or {}), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-3000:]
    return folder


def weights(folder: RLFolder, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(folder.checkpoint_path(step) / "trainable.safetensors"))


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """The shipped config's LoRA trainer (in float32), 2 steps, alone and as 2 ranks."""
    root = tmp_path_factory.mktemp("dp")
    return run(root / "one", 2, "lora", 1, FLOAT32), run(root / "two", 2, "lora", 2, FLOAT32)


def test_two_ranks_make_the_same_update_as_one_process(lora_runs):
    one, two = lora_runs
    assert max_difference(weights(one, 2), weights(two, 2)) < 1e-5
    for a, b in zip(one.trainer_metrics.read(), two.trainer_metrics.read(), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert a["tokens"] == b["tokens"] and b["ranks"] == 2
    adapters = [load_file(str(f.checkpoint_path(2) / "adapter" / "adapter_model.safetensors")) for f in lora_runs]
    assert max_difference(*adapters) < 1e-5  # the adapter vLLM would load, written by rank 0 from gathered shards
    merged = [load_file(str(f.weights(merged=True) / "model.safetensors")) for f in lora_runs]
    assert max_difference(*(({k: v.float() for k, v in m.items()}) for m in merged)) < 1e-2  # bf16 files


def test_each_rank_takes_the_logprobs_straight_from_the_hidden_states(lora_runs):
    """The update above went through the hidden-state head (`lm_head`) on both ranks: no rank made the logits."""
    one, two = lora_runs
    assert [json.loads((f.path / f"head-rank{r}.json").read_text())["head"] for f, r in ((one, 0), (two, 0), (two, 1))
            ] == [True, True, True]


def test_only_rank_zero_records_and_publishes(lora_runs):
    _, two = lora_runs
    published = [json.loads(line) for line in (two.path / "published.jsonl").read_text().splitlines()]
    assert [(p["rank"], p["version"]) for p in published] == [(0, 1), (0, 2)]
    assert [r["step"] for r in two.trainer_metrics.read()] == [0, 1]
    assert two.policy("base") == (2, "policy")
    assert json.loads((two.checkpoint_path(2) / "DONE").read_text())["version"] == 2


def test_a_checkpoint_saved_by_two_ranks_resumes_in_one_process_and_back(lora_runs, tmp_path):
    one, two = lora_runs
    from_two = run(tmp_path / "from_two", 2, "lora", 1, FLOAT32, resume_from=two.path)
    from_one = run(tmp_path / "from_one", 2, "lora", 2, FLOAT32, resume_from=one.path)
    for resumed in (from_two, from_one):
        assert [r["step"] for r in resumed.trainer_metrics.read()] == [1]  # step 0 came from the checkpoint
        assert max_difference(weights(resumed, 2), weights(one, 2)) < 1e-5


def test_full_weights_in_bfloat16_match_to_its_rounding(tmp_path):
    """The shipped compute dtype on the full-weight path: the loss agrees to bf16's precision and the update
    differs only where Adam's sign of a near-zero gradient flipped."""
    one, two = run(tmp_path / "one", 1, "full", 1), run(tmp_path / "two", 1, "full", 2)
    (a,), (b,) = one.trainer_metrics.read(), two.trainer_metrics.read()
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)
    wa, wb = weights(one, 1), weights(two, 1)
    off = sum(int(((wa[k] - wb[k]).abs() > 1e-5).sum()) for k in wa)
    assert off < 0.02 * sum(v.numel() for v in wa.values())
    assert (two.weights(merged=False) / "config.json").is_file()  # the model directory vLLM would load
