"""Trainer numbers pinned on a fixed batch: a change to batching, layout or precision must give the same loss,
gradient norm, logprobs and updated adapter as the trainer these figures were taken from (float32)."""

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tracegym.core.sample import Sample
from tracegym.train.trainer import Trainer, TrainerConfig, apply_lora

VOCAB = 64
PINNED = {"loss": 0.005749826319515705, "grad_norm": 0.9122638702392578, "adapter_sum": -3.893703012727201,
          "adapter_abs_sum": 202.35167486779392, "logprob_sum": -205.05652618408203}
"""Taken from the trainer of b557116 (one left-padded row per sample, float32)."""


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trainer(**options: object) -> Trainer:
    """A seeded tiny Llama with a LoRA adapter whose B is non-zero (so the first step's gradient reaches A)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    settings = TrainerConfig(model="tiny", lora_rank=4, learning_rate=1e-2, compute_dtype="float32", **options)
    model = apply_lora(LlamaForCausalLM(config), settings)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return Trainer(model, settings)


def batch() -> list[Sample]:
    """Two groups of four rollouts sharing their prompt, a two-turn sample (loss on two assistant turns, a tool
    result between), a sample at another temperature with the first group's prompt, and per-token advantages."""
    rng = random.Random(7)
    out = []
    for prompt_len, temperature in ((5, 1.0), (9, 0.7)):
        prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
        for i in range(4):
            completion = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 7))]
            out.append(sample(prompt, completion, advantage=(i - 1.5) / 1.5, temperature=temperature, rng=rng))
    first = out[0].token_ids[:5]
    out.append(sample(first, [rng.randrange(VOCAB) for _ in range(4)], advantage=0.5, temperature=0.5, rng=rng))
    turns = [rng.randrange(VOCAB) for _ in range(14)]
    mask = [False] * 4 + [True] * 3 + [False] * 3 + [True] * 4
    out.append(Sample(token_ids=turns, loss_mask=mask, logprobs=[rng.uniform(-5, -1) if m else 0.0 for m in mask],
                      advantage=-0.8, temperature=1.0))
    tokens = out[4].token_ids
    per_token = [rng.uniform(-1, 1) if m else 0.0 for m in out[4].loss_mask]
    out.append(out[4].model_copy(update={"token_ids": [*tokens[:-1], (tokens[-1] + 1) % VOCAB],
                                         "token_advantages": per_token}))
    return out


def sample(prompt: list[int], completion: list[int], advantage: float, temperature: float,
           rng: random.Random) -> Sample:
    mask = [False] * len(prompt) + [True] * len(completion)
    return Sample(token_ids=prompt + completion, loss_mask=mask,
                  logprobs=[rng.uniform(-5, -1) if m else 0.0 for m in mask], advantage=advantage,
                  temperature=temperature)


def figures(options: dict[str, object]) -> dict[str, float]:
    stepper = trainer(**options)
    logprobs = stepper.logprobs(batch())
    metrics = stepper.step(batch())
    adapter = [p.detach() for p in stepper.model.parameters() if p.requires_grad]
    return {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
            "adapter_sum": float(sum(p.double().sum() for p in adapter)),
            "adapter_abs_sum": float(sum(p.double().abs().sum() for p in adapter)),
            "logprob_sum": float(sum(sum(row) for row in logprobs))}


LAYOUTS = {"default": {}, "small-micro-batches": {"micro_batch_tokens": 16},
           "one-micro-batch": {"micro_batch_tokens": 4096}, "a-row-per-sample": {"share_prompts": False}}


@pytest.mark.parametrize("options", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_step_on_the_fixed_batch_gives_the_pinned_figures(options):
    assert figures(options) == pytest.approx(PINNED, rel=1e-5, abs=1e-6)


@pytest.mark.slow  # compiling takes ~20 s
def test_a_compiled_trainer_gives_the_pinned_figures():
    assert figures({"compile": True}) == pytest.approx(PINNED, rel=1e-5, abs=1e-6)
