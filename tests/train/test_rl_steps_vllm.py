"""Slow: two real RL steps on the embedded model: vLLM serves the LoRA adapter, the trainer steps, the new adapter
is loaded in place, and vLLM then scores tokens like the trainer's new weights, not like the first adapter."""

import json
import statistics
import urllib.request

import pytest

import tracegym as tg
from tracegym.core.sample import Sample
from tracegym.envs.registry import load_taskset
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.advantages import GroupAdvantages
from tracegym.train.samples import trace_samples
from tracegym.train.trainer import TrainerConfig, build_trainer
from tracegym.train.weight_sync import WeightSync

pytestmark = pytest.mark.slow



def vllm_logprobs(base_url: str, model: str, token_ids: list[int]) -> list[float]:
    """vLLM's logprob of each token of `token_ids` after the first (prompt logprobs of a 1-token completion)."""
    body = {"model": model, "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
    request = urllib.request.Request(f"{base_url}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        entries = json.load(response)["choices"][0]["prompt_logprobs"]
    return [entry[str(token)]["logprob"] for token, entry in zip(token_ids[1:], entries[1:], strict=True)]


def samples_of(traces: list[tg.Trace], version: int) -> list[Sample]:
    """Group-mean advantages per task; samples stamped with the version that sampled them."""
    advantages, out = GroupAdvantages(), []
    for key in {t.task_key for t in traces}:
        group = [t for t in traces if t.task_key == key]
        values = advantages([t.reward or 0.0 for t in group], key=key)
        for trace, value in zip(group, values or [], strict=False):
            out += [s.model_copy(update={"advantage": value, "policy_version": version}) for s in trace_samples(trace)]
    return out


def mean_abs_diff(a: list[float], b: list[float]) -> float:
    return statistics.fmean(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_two_rl_steps_change_the_adapter_and_vllm_serves_the_new_version(tmp_path):
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, learning_rate=5e-3, num_threads=2))
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=1024,
                              enable_lora=True, max_lora_rank=16)
    with VLLMServer(config) as server:
        sync = WeightSync(server.base_url)
        sync.publish(trainer.save_weights(tmp_path / "current"), trainer.version)
        endpoint = tg.Endpoint(base_url=server.base_url, model=sync.model_name, api_key_env=None, tokens="on")
        async with ChatClient(endpoint) as client:
            first = await tg.evaluate("reverse-text", client, num_tasks=1, sampling=tg.Sampling(max_tokens=16))
            probe = first[0].graph.tokens()
            before = vllm_logprobs(server.base_url, sync.model_name, probe)
            for step in range(2):
                traces = await tg.evaluate(load_taskset("reverse-text", {"seed": step}), client, num_tasks=2,
                                           rollouts=4, sampling=tg.Sampling(temperature=1.0, max_tokens=24))
                batch = samples_of(traces, trainer.version)
                assert batch, "both groups had no signal"
                trainer.step(batch)
                sync.publish(trainer.save_weights(tmp_path / "current"), trainer.version)
        after = vllm_logprobs(server.base_url, sync.model_name, probe)

    probe_sample = Sample(token_ids=probe, loss_mask=[False] + [True] * (len(probe) - 1), logprobs=[0.0] * len(probe))
    trainer_after = trainer.logprobs([probe_sample])[0][1:]
    assert (trainer.version, sync.version) == (2, 2)
    assert any(not p.detach().equal(initial[n]) for n, p in trainer.model.named_parameters() if n in initial)
    assert mean_abs_diff(after, before) > 1e-3  # the adapter changed what vLLM serves
    assert mean_abs_diff(after, trainer_after) < mean_abs_diff(before, trainer_after)  # ...into the new version
