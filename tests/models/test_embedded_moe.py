"""Embedded MoE: its config from the dense model's, and the real model sampled and replayed by the trainer."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tracegym import load_taskset
from tracegym.core.sampling import Sampling
from tracegym.envs.rollout import rollout
from tracegym.models.embedded_moe import MoeShape, embedded_moe_dir, moe_config
from tracegym.models.moe_sampler import MoeSamplerClient
from tracegym.models.renderer import load_renderer
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import TrainerConfig, make_trainer


def test_the_moe_config_keeps_the_dense_models_vocabulary_and_width_with_the_shapes_experts() -> None:
    dense = {"vocab_size": 100, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1,
             "head_dim": 16, "intermediate_size": 999}
    config = moe_config(MoeShape(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2), dense)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (100, 48, 3)
    assert (config.num_experts, config.num_experts_per_tok, config.tie_word_embeddings) == (4, 2, False)


@pytest.mark.slow
def test_a_rollout_on_the_embedded_moe_in_float32_is_scored_alike_by_the_replaying_trainer() -> None:
    from transformers import AutoModelForCausalLM

    folder = embedded_moe_dir()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    taskset = load_taskset("reverse-text")
    client = MoeSamplerClient(model, load_renderer(str(folder)), seed=1)
    trace = asyncio.run(rollout(taskset.task(next(iter(taskset.load()))), client, Sampling(max_tokens=32)))
    (sample,) = trace_samples(trace)
    assert sample.routed_experts is not None and sample.routed_experts[-1] == []
    trainer = make_trainer(model, TrainerConfig(model=str(folder), lora=False, compute_dtype="float32"))
    (scored,) = trainer.logprobs([sample])
    torch.testing.assert_close(torch.tensor(scored), torch.tensor(sample.logprobs), atol=1e-4, rtol=0)
