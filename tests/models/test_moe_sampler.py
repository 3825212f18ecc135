"""MoE sampler client: routing per forwarded token, carried through the graph into samples the trainer replays."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from tracegym.core.errors import ModelError
from tracegym.core.messages import user
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.moe_sampler import MoeSamplerClient
from tracegym.models.renderer import Renderer, renderer_for
from tracegym.testing.moe import tiny_moe
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import TrainerConfig, make_trainer


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return renderer_for(AutoTokenizer.from_pretrained(embedded_model_dir()))


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_moe(seed=0, vocab_size=49152)


def _complete(client: MoeSamplerClient, trace: Trace, sampling: Sampling) -> ModelResponse:
    return asyncio.run(client.complete(ModelRequest(messages=trace.graph.messages(), sampling=sampling)))


def test_the_sampler_returns_one_routing_row_per_forwarded_token(model: Any, renderer: Renderer) -> None:
    trace = Trace(task=TaskData(prompt="hi"), taskset="t")
    trace.graph.add(user("hi"))
    reply = _complete(MoeSamplerClient(model, renderer), trace, Sampling(temperature=1.0, max_tokens=12))
    assert reply.prompt_token_ids and reply.completion_token_ids and reply.routed_experts
    assert len(reply.routed_experts) == len(reply.prompt_token_ids) + len(reply.completion_token_ids) - 1
    assert {(len(row), len(row[0])) for row in reply.routed_experts} == {(2, 2)}


def test_a_sampled_turns_sample_scores_its_sampler_logprobs_under_replay(model: Any, renderer: Renderer) -> None:
    trace = Trace(task=TaskData(prompt="reverse: abc"), taskset="t")
    trace.graph.add(user("reverse: abc"))
    reply = _complete(MoeSamplerClient(model, renderer, seed=3), trace, Sampling(temperature=1.0, max_tokens=24))
    trace.graph.add_model_turn(reply.message, reply.prompt_token_ids, reply.completion_token_ids,
                               reply.completion_logprobs, temperature=1.0, routed_experts=reply.routed_experts)
    (sample,) = trace_samples(trace)
    (scored,) = make_trainer(model, TrainerConfig(model="tiny-moe", lora=False, compute_dtype="float32")).logprobs(
        [sample])
    torch.testing.assert_close(torch.tensor(scored), torch.tensor(sample.logprobs), atol=1e-4, rtol=0)


def test_the_sampler_refuses_top_p_by_name(model: Any, renderer: Renderer) -> None:
    trace = Trace(task=TaskData(prompt="hi"), taskset="t")
    trace.graph.add(user("hi"))
    with pytest.raises(ModelError, match="top_p"):
        _complete(MoeSamplerClient(model, renderer), trace, Sampling(temperature=1.0, top_p=0.9, max_tokens=4))
