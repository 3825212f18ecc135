"""Replay of an RL step (`tracegym rl --replay`, `train.replay`) on the embedded SmolLM2-135M, LoRA and full: a run
of `--steps` trainer steps on stored batches (checkpoints every `--every`), then each step replayed from what the
run folder holds, timed; then one stored batch changed (one sample's advantage sign flipped: the batch of step
`steps - 2`, which the last step's replay reruns from its checkpoint) and the last step replayed, which must name
the changed step and its first tensor. Figures: the run's step time, each replay's time
and result, the digest's share of a step.

The batches are what the orchestrator writes (`RLFolder.write_batch`): 16 samples of a 40-token prompt and a
48-token completion, tokens drawn from the vocabulary with a fixed seed (the trainer's arithmetic does not depend on
what the tokens mean), their sampler logprobs the base model's own (so the ratio bounds mask nothing). No vLLM:
publishing a policy is a no-op here.

    python benchmarks/replay_step.py [--steps 4] [--every 2]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch


def samples(step: int, vocab: int, n: int = 16, prompt: int = 40, completion: int = 48) -> list:
    from tracegym.core.sample import Sample

    rng = random.Random(step)
    mask = [False] * prompt + [True] * completion
    return [Sample(token_ids=[rng.randrange(vocab) for _ in mask], loss_mask=mask,
                   logprobs=[-rng.uniform(0.5, 4.0) if m else 0.0 for m in mask],
                   advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5), temperature=1.0, policy_version=step)
            for _ in range(n)]


def run(label: str, lora: bool, steps: int, every: int, threads: int) -> None:
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.train.replay import replay
    from tracegym.train.rl_folder import RLFolder
    from tracegym.train.trainer import TrainerConfig, build_trainer
    from tracegym.train.trainer_loop import TrainerLoop

    config = TrainerConfig(model=str(embedded_model_dir()), lora=lora, num_threads=threads,
                           learning_rate=2e-4 if lora else 1e-5)
    with tempfile.TemporaryDirectory() as tmp:
        folder = RLFolder(Path(tmp))
        trainer = build_trainer(config)
        vocab = trainer.model.config.vocab_size
        for step in range(steps):  # the base model's own logprobs: no token falls outside the ratio bounds
            batch = samples(step, vocab)
            scored = trainer.logprobs(batch)
            batch = [s.model_copy(update={"logprobs": lp}) for s, lp in zip(batch, scored, strict=True)]
            folder.write_batch(step, batch, {}, state={"next_step": step + 1})
        started = time.perf_counter()
        TrainerLoop(folder, trainer, lambda _path, _version: "policy", steps=steps, checkpoint_every=every).run()
        step_s = (time.perf_counter() - started) / steps
        records = folder.trainer_metrics.read()
        digest_s = [r.get("digest_s") for r in records]
        norms = ", ".join(f"{r.get('grad_norm', 0):.3f}" for r in records)
        masked = max(r.get("masked_low_frac", 0) + r.get("masked_high_frac", 0) for r in records)
        print(f"{label}: run of {steps} steps, {step_s:.2f} s/step (checkpoints every {every}; digest "
              f"{_mean(digest_s)}); grad norm per step {norms}; at most {masked:.1%} of tokens masked")
        for step in range(steps):
            started = time.perf_counter()
            result = replay(Path(tmp), step, config, build_trainer)
            print(f"  replay step {step}: {time.perf_counter() - started:.1f} s, {result.line()}")
        tampered = steps - 2  # after the last checkpoint before the final step: the replay of that step reruns it
        stored = folder.read_batch(tampered)
        assert stored is not None
        changed = list(stored.samples)
        changed[0] = changed[0].model_copy(update={"advantage": -changed[0].advantage})
        folder.write_batch(tampered, changed, {}, state={"next_step": tampered + 1})
        started = time.perf_counter()
        result = replay(Path(tmp), steps - 1, config, build_trainer)
        print(f"  batch {tampered} changed, replay step {steps - 1}: {time.perf_counter() - started:.1f} s, "
              f"{result.line()}")


def _mean(values: list) -> str:
    found = [v for v in values if isinstance(v, (int, float))]
    return f"{1000 * sum(found) / len(found):.0f} ms/step" if found else "not recorded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {args.threads} threads")
    for label, lora in (("lora", True), ("full", False)):
        run(label, lora, args.steps, args.every, args.threads)


if __name__ == "__main__":
    main()
