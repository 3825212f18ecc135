"""Slow: the merged weight sync against the real embedded vLLM: the adapter merged by vLLM itself, a reload of all
weights but the frozen embeddings and a full reload serve the same weights, and they are the trainer's, not the
base's; merging into another base than the one vLLM serves is refused, naming both; a publish while a request
runs resets the prefix cache (which a plain reset cannot) and the request still finishes."""

import json
import urllib.request

import pytest
import torch
from safetensors.torch import save_file
from test_rl_steps_vllm import mean_abs_diff, vllm_logprobs  # the same directory
from transformers import AutoTokenizer

from tracegym.core.errors import TracegymError
from tracegym.core.sample import Sample
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.trainer import TrainerConfig, build_trainer
from tracegym.train.weight_sync import MergedWeightSync

pytestmark = pytest.mark.slow


def other_base(folder):
    """A "base model" whose final norm is not SmolLM2's."""
    folder.mkdir()
    save_file({"model.norm.weight": torch.full((576,), 2.0)}, str(folder / "model.safetensors"))
    return folder


def test_a_merged_adapter_and_both_reloads_serve_the_trainers_merged_weights(tmp_path):
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, num_threads=2))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an adapter far from zero, as after training, so the served weights visibly move
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=256,
                              cpu_kv_cache_gib=0.25, cpu_one_process=True, merge_adapters=True)
    text = "The quick brown fox jumps over the lazy dog, then reverses the text."
    probe = AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"]
    with VLLMServer(config) as server:
        sync = MergedWeightSync(server.base_url, SERVED_MODEL_NAME, base_model=model_dir)
        base = vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe)
        sync.publish(trainer.save_weights(tmp_path / "adapter"), version=1)
        merged = vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe)
        other = MergedWeightSync(server.base_url, SERVED_MODEL_NAME, base_model=other_base(tmp_path / "other"))
        with pytest.raises(TracegymError, match="serves other weights than the base model in folder 'other'"):
            other.publish(tmp_path / "adapter", version=2)
        assert vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe) == merged  # still serving, unchanged
        sync.publish(trainer.save_merged(tmp_path / "changed", changed_only=True), version=1)
        partial = vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe)
        sync.publish(trainer.save_merged(tmp_path / "full"), version=2)
        full = vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe)
        sync.publish(tmp_path / "adapter", version=3)  # vLLM serves the trainer's base again, the adapter merged
        assert vllm_logprobs(server.base_url, SERVED_MODEL_NAME, probe) == merged
    sample = Sample(token_ids=probe, loss_mask=[False] + [True] * (len(probe) - 1), logprobs=[0.0] * len(probe))
    trained = trainer.logprobs([sample])[0][1:]
    assert mean_abs_diff(merged, partial) < 1e-4 and mean_abs_diff(partial, full) < 1e-3  # the same weights
    assert mean_abs_diff(partial, base) > 0.05  # ...which moved
    assert mean_abs_diff(partial, trained) < mean_abs_diff(base, trained) / 2  # ...to the trainer's (bf16 vs fp32)


PROMPT = "Count slowly, one number a line, from one to a thousand, and say nothing else at all. " * 12
RUNNING = "Name every planet, then every moon of each, one a line, with its discoverer's name. " * 12
"""The prompt of the request that runs through a publish (it shares no block with PROMPT)."""


@pytest.fixture(scope="module")
def stamping_server():
    """vLLM merging adapters, stamping versions and reporting cached prompt tokens."""
    config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                              max_model_len=1024, cpu_kv_cache_gib=0.25, cpu_one_process=True, merge_adapters=True,
                              report_policy_version=True, extra_args=["--enable-prompt-tokens-details"])
    with VLLMServer(config) as server:
        yield server


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    model_dir = str(embedded_model_dir())
    return build_trainer(TrainerConfig(model=model_dir, num_threads=2)).save_weights(
        tmp_path_factory.mktemp("sync") / "adapter")


def completion(base_url: str, tokens: int, prompt: str = PROMPT, stream: bool = False):
    """A completion of exactly `tokens` tokens: its reply, or (streaming) the open response once its first token
    arrived, so that it is running."""
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    request = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    response = urllib.request.urlopen(request, timeout=120)
    if not stream:
        with response:
            return json.load(response)
    while not response.readline().startswith(b"data: {"):
        pass
    return response


def cached_tokens(base_url: str) -> int:
    return completion(base_url, tokens=1)["usage"]["prompt_tokens_details"]["cached_tokens"]


def rest_of_stream(response) -> list[dict]:
    with response:
        lines = [line[len(b"data: "):] for line in response if line.startswith(b"data: {")]
    return [json.loads(line) for line in lines]


def finished_with(chunks: list[dict]) -> tuple[int, str]:
    """A stream's completion tokens and last finish reason."""
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    return chunks[-1]["usage"]["completion_tokens"], reasons[-1]


def test_a_publish_while_a_request_runs_resets_the_prefix_cache_and_the_request_finishes(stamping_server, adapter):
    url = stamping_server.base_url
    cached_tokens(url)  # PROMPT's blocks are cached
    running = completion(url, tokens=160, prompt=RUNNING, stream=True)
    plain = urllib.request.Request(url.removesuffix("/v1") + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(plain, timeout=30) as reply:
        assert json.load(reply) == {"success": False}  # vLLM keeps blocks a running request holds
    MergedWeightSync(url, SERVED_MODEL_NAME, base_model=str(embedded_model_dir())).publish(adapter, version=1)
    assert cached_tokens(url) == 0  # the reset succeeded
    assert finished_with(rest_of_stream(running)) == (160, "length")


def test_an_announced_version_keeps_its_prompt_kv_apart_from_older_versions(stamping_server, adapter):
    url = stamping_server.base_url
    sync = MergedWeightSync(url, SERVED_MODEL_NAME, base_model=str(embedded_model_dir()), announce=True)
    sync.publish(adapter, version=2)
    running = completion(url, tokens=160, prompt=RUNNING, stream=True)  # no reset could succeed while it runs
    cached_tokens(url)
    assert cached_tokens(url) > 0
    sync.publish(adapter, version=3)
    assert cached_tokens(url) == 0  # version 3 reuses nothing version 2 computed...
    assert cached_tokens(url) > 0  # ...but its own
    assert finished_with(rest_of_stream(running)) == (160, "length")
