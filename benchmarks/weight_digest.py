"""Weight digest cost: hashing a model's trainable weights after a step (`train.weight_digest`), LoRA and full,
on the embedded SmolLM2-135M, beside the time of one copy of the same tensors (a floor for touching every byte).

    python benchmarks/weight_digest.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def main() -> None:
    from transformers import AutoModelForCausalLM

    from tracegym.models.embedded import embedded_model_dir
    from tracegym.train.trainer import TrainerConfig, apply_lora
    from tracegym.train.weight_digest import weight_digest

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    reps = parser.parse_args().reps
    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)
    full = sum(p.numel() for p in model.parameters())
    print(f"threads {torch.get_num_threads()}, full model {full / 1e6:.1f}M parameters ({full * 4 / 2**20:.0f} MiB)")
    for label in ("full", "lora"):  # LoRA second: wrapping the model freezes its base weights
        subject = model if label == "full" else apply_lora(model, TrainerConfig(model="embedded"))
        params = [p for p in subject.parameters() if p.requires_grad]
        digest_s = _timed(lambda s=subject: weight_digest(s), reps)
        copy_s = _timed(lambda ps=params: [p.detach().clone() for p in ps], reps)
        size = sum(p.numel() for p in params) * 4 / 2**20
        print(f"{label}: {size:8.1f} MiB trainable: digest {digest_s * 1e3:8.1f} ms (median of {reps}), "
              f"one copy {copy_s * 1e3:7.1f} ms, ratio {digest_s / copy_s:5.1f}x")


def _timed(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    main()
