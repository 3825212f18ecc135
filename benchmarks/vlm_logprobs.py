"""Benchmark: how close the trainer's logprobs on image samples are to vLLM's sampled ones, with the pictures and
without them, on the first batch of an RL run of the embedded VLM (sampled by the base weights, which the trainer
holds before its first step).

Mean |logprob_trainer - logprob_vLLM| over the batch's loss tokens, the figure `abs_log_ratio_mean` is of a step;
"without the pictures" runs the same token ids with the `<image>` tokens as plain embeddings (what training would
compute had the images been dropped).

    flock /work/heavy.lock .venv/bin/python benchmarks/vlm_logprobs.py RUN_DIR   (a `tracegym rl` run of the VLM)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tracegym.core.sample import Sample
from tracegym.train.image_inputs import folder_source
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import load_config
from tracegym.train.trainer import build_trainer


def mean_gap(trainer, samples: list[Sample]) -> tuple[float, float]:
    """Mean and largest |trainer - sampler| logprob over the loss tokens."""
    gaps = [abs(mine - theirs) for s, lps in zip(samples, trainer.logprobs(samples), strict=True)
            for mine, theirs, m in zip(lps, s.logprobs, s.loss_mask, strict=True) if m]
    return statistics.mean(gaps), max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    folder = RLFolder(args.run_dir)
    batch = folder.read_batch(0)
    if batch is None:
        raise SystemExit(f"{args.run_dir} has no batch of step 0")
    config = load_config(args.run_dir).trainer
    trainer = build_trainer(config, images=folder_source(folder.images.folder))
    samples = batch.samples
    tokens = sum(s.num_trained for s in samples)
    print(f"{len(samples)} samples, {tokens} loss tokens, {sum(len(s.images) for s in samples)} image runs")
    for name, batch_samples in (("with the pictures", samples),
                                ("without the pictures", [s.model_copy(update={"images": []}) for s in samples])):
        mean, most = mean_gap(trainer, batch_samples)
        print(f"{name}: mean |dlogprob| {mean:.4f}, max {most:.4f}")


if __name__ == "__main__":
    main()
