"""MoE routed-expert replay: the sampler-vs-trainer logprob mismatch on the embedded tiny MoE, with and without replay.

The sampler is `models.moe_sampler.MoeSamplerClient` (token by token with a KV cache, recording the routers' choices)
in bfloat16 or float32; each reply goes through `MessageGraph.add_model_turn` and `trace_samples` like a rollout's,
and the float32 trainer (`Trainer.logprobs`) scores the samples twice: routing freely, and replaying the sampler's
experts. Run: `python benchmarks/moe_replay.py [--prompts 16] [--max-tokens 32]` (writes benchmarks/moe_replay.json).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tracegym.core.messages import user
from tracegym.core.sample import Sample
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.models.client import ModelRequest
from tracegym.models.embedded_moe import MoeShape, embedded_moe_dir
from tracegym.models.expert_routing import recorded_routing, stacked
from tracegym.models.moe_sampler import MoeSamplerClient
from tracegym.models.renderer import load_renderer
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import TrainerConfig, make_trainer

WORDS = ("apple", "river", "stone", "cloud", "seven", "green", "quiet", "table", "orange", "window", "music", "paper",
         "light", "north", "bread", "silver", "garden", "winter", "candle")


def prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Reverse the text: {' '.join(rng.sample(WORDS, 4))}" for _ in range(count)]


async def sample_all(client: MoeSamplerClient, texts: list[str], max_tokens: int) -> list[Sample]:
    """One single-turn trace per prompt, sampled at temperature 1, flattened into its training sample."""
    out = []
    for text in texts:
        trace = Trace(task=TaskData(prompt=text), taskset="moe-replay")
        trace.graph.add(user(text))
        reply = await client.complete(ModelRequest(messages=trace.graph.messages(),
                                                   sampling=Sampling(temperature=1.0, max_tokens=max_tokens)))
        trace.graph.add_model_turn(reply.message, reply.prompt_token_ids, reply.completion_token_ids,
                                   reply.completion_logprobs, temperature=1.0, routed_experts=reply.routed_experts)
        out.extend(trace_samples(trace))
        print(f"sampled {len(out)}/{len(texts)}", file=sys.stderr, flush=True)
    return out


@torch.no_grad()
def free_routing(model: Any, sample: Sample) -> list[list[list[int]]]:
    """The experts the float32 trainer model picks itself for each position of `sample`."""
    record: list[list[torch.Tensor]] = []
    with recorded_routing(model, record):
        model(input_ids=torch.tensor([sample.token_ids]))
    return stacked(record).tolist()


def routing_differs(model: Any, samples: list[Sample]) -> dict[str, float]:
    """Of the positions the sampler forwarded: the share whose top-k set differs in at least one layer, and the
    share of (position, layer) pairs that differ."""
    positions = pairs = differ_pos = differ_pairs = 0
    for sample in samples:
        own = free_routing(model, sample)
        for mine, theirs in zip(own, sample.routed_experts or [], strict=True):
            if not theirs:
                continue
            flags = [sorted(a) != sorted(b) for a, b in zip(mine, theirs, strict=True)]
            positions, pairs = positions + 1, pairs + len(flags)
            differ_pos, differ_pairs = differ_pos + any(flags), differ_pairs + sum(flags)
    return {"positions": positions, "routing_differs_positions": differ_pos / positions,
            "routing_differs_layer_pairs": differ_pairs / pairs}


def mismatch(samples: list[Sample], trainer_logprobs: list[list[float]]) -> dict[str, float]:
    """|trainer - sampler| logprob over loss tokens: mean (95% interval over samples), p99, max."""
    gaps, per_sample = [], []
    for sample, values in zip(samples, trainer_logprobs, strict=True):
        mine = [abs(t - s) for t, s, m in zip(values, sample.logprobs, sample.loss_mask, strict=True) if m]
        gaps += mine
        per_sample.append(statistics.fmean(mine))
    half = 1.96 * statistics.stdev(per_sample) / math.sqrt(len(per_sample))
    ordered = sorted(gaps)
    return {"tokens": len(gaps), "mean_abs": statistics.fmean(gaps), "mean_abs_ci95": half,
            "p99_abs": ordered[int(0.99 * (len(ordered) - 1))], "max_abs": ordered[-1],
            "share_over_0.01": sum(g > 0.01 for g in gaps) / len(gaps)}


def run(sampler_dtype: torch.dtype, trainer: Any, model: Any, renderer: Any, texts: list[str],
        max_tokens: int) -> dict[str, Any]:
    sampler_model = copy.deepcopy(model).to(sampler_dtype)
    samples = asyncio.run(sample_all(MoeSamplerClient(sampler_model, renderer, seed=0), texts, max_tokens))
    stripped = [s.model_copy(update={"routed_experts": None}) for s in samples]
    free = trainer.logprobs(stripped)
    replayed = trainer.logprobs(samples)
    return {"sampler_dtype": str(sampler_dtype).removeprefix("torch."), **routing_differs(model, samples),
            "free": mismatch(samples, free), "replay": mismatch(samples, replayed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    shape = MoeShape()
    folder = embedded_moe_dir(shape)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    renderer = load_renderer(str(folder))
    trainer = make_trainer(model, TrainerConfig(model=str(folder), lora=False, compute_dtype="float32"))
    texts = prompts(args.prompts, args.seed)
    results = {"model": shape.name, "prompts": args.prompts, "max_tokens": args.max_tokens,
               "runs": [run(dtype, trainer, model, renderer, texts, args.max_tokens)
                        for dtype in (torch.bfloat16, torch.float32)]}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
