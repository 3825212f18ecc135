"""Benchmark: one trainer step of the embedded VLM (LoRA r=16 on its text tower) on colour-codeword samples with
their images, against text stand-ins of the same shape, side by side in one process, steps alternating.

"text stand-in" replaces each picture's 49 `<image>` tokens with a text token of its own (one per picture), so the
rows are laid out as with the pictures (a group's samples share a row, groups do not) and only the vision tower,
connector and merging are missing: the cost of the images. "image tokens, no pictures" keeps the `<image>` tokens
and drops the pictures: every prompt is then the same tokens, so all samples share one row; that is the layout a
trainer that ignored the pictures would train (wrongly), shown for the size of the sharing effect.

The batch is a colour-codeword step: `--groups` pictures x `--rollouts` rollouts, each prompt the taskset's system
prompt, picture (a 52-token run: 49 image tokens, framed) and question as the VLM's renderer makes them, each
completion a code word and `<|im_end|>`. Sampler logprobs are the trainer's own (nothing masked).

    flock /work/heavy.lock .venv/bin/python benchmarks/vlm_trainer_step.py [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from tracegym.core.sample import Sample
from tracegym.envs.registry import load_taskset
from tracegym.models.client import ModelRequest
from tracegym.models.embedded_vlm import embedded_vlm_dir
from tracegym.models.image_prompt import image_bytes, message_images
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import next_prompt_ids
from tracegym.tasksets.colour_codeword import CODEWORDS
from tracegym.train.trainer import TrainerConfig, build_trainer


def colour_samples(groups: int, rollouts: int) -> tuple[list[Sample], dict[str, bytes]]:
    """A colour-codeword step's samples (with their image runs) and the images by hash."""
    folder = str(embedded_vlm_dir())
    renderer = load_renderer(folder)
    taskset = load_taskset("colour-codeword", {"num_tasks": groups, "seed": 0})
    words = list(CODEWORDS.values())
    images: dict[str, bytes] = {}
    out = []
    for g, row in enumerate(taskset):
        messages = row.initial_messages()
        prompt = next_prompt_ids(renderer, ModelRequest(messages))
        parts = message_images(messages)
        spans = renderer.images.spans(prompt, parts)
        images |= {hashlib.sha256(image_bytes(p)).hexdigest(): image_bytes(p) for p in parts}
        for r in range(rollouts):
            reply = renderer.tokenizer(words[(g + r) % len(words)] + "<|im_end|>")["input_ids"]
            ids = prompt + reply
            out.append(Sample(token_ids=ids, loss_mask=[False] * len(prompt) + [True] * len(reply),
                              logprobs=[0.0] * len(ids), advantage=1.0 if r % 2 else -1.0, images=spans))
    return out, images


def stand_ins(samples: list[Sample], config) -> list[Sample]:
    """The samples with each picture's `<image>` tokens replaced by a text token of that picture's own."""
    image_token = config.image_token_id
    pictures = {sha: 1000 + i for i, sha in enumerate(dict.fromkeys(s.images[0].sha256 for s in samples))}
    return [s.model_copy(update={"images": [], "token_ids": [pictures[s.images[0].sha256] if t == image_token else t
                                                             for t in s.token_ids]}) for s in samples]


def own_logprobs(trainer, samples: list[Sample]) -> list[Sample]:
    return [s.model_copy(update={"logprobs": lp}) for s, lp in zip(samples, trainer.logprobs(samples), strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tracegym rl on 2 cores: 1)")
    args = parser.parse_args()
    samples, images = colour_samples(args.groups, args.rollouts)
    config = TrainerConfig(model=str(embedded_vlm_dir()), num_threads=args.threads, micro_batch_tokens=1024)
    trainer = build_trainer(config, images=images.__getitem__)
    batches = {"with images": own_logprobs(trainer, samples),
               "text stand-in": own_logprobs(trainer, stand_ins(samples, trainer.model.config)),
               "image tokens, no pictures": own_logprobs(trainer, [s.model_copy(update={"images": []})
                                                                   for s in samples])}
    for batch in batches.values():  # warm-up
        trainer.step(batch)
    seconds: dict[str, list[float]] = {name: [] for name in batches}
    for _ in range(args.steps):
        for name, batch in batches.items():
            start = time.perf_counter()
            trainer.step(batch)
            seconds[name].append(time.perf_counter() - start)
    tokens = sum(len(s) for s in samples)
    print(f"{len(samples)} samples ({args.groups} pictures x {args.rollouts} rollouts), {tokens} tokens "
          f"({len(samples[0])} per sample), {len(images)} distinct images, torch threads {torch.get_num_threads()}")
    for name, values in seconds.items():
        print(f"{name}: step {statistics.mean(values):.2f} s (mean of {len(values)}; "
              f"{', '.join(f'{v:.2f}' for v in values)})")
    pixels = time.perf_counter()
    trainer.images._pixels.clear()  # what the first step of a new image pays
    trainer.images.pixels(list(images))
    print(f"image processor: {(time.perf_counter() - pixels) / len(images) * 1000:.1f} ms per image (once each)")


if __name__ == "__main__":
    main()
