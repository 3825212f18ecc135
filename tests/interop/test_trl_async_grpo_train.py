"""A real TRL 1.16 `AsyncGRPOTrainer` run of a few steps with a tracegym taskset, on this CPU: its spawned rollout
worker unpickles the adapter's environment class and reward functions and generates against a real vLLM (the
embedded SmolLM2-135M, LoRA adapters loadable at run time, vLLM's dev routes for TRL's pause/resume); the trainer
updates a LoRA adapter on those rollouts and publishes each version to that vLLM by its own adapter sync.

Two things TRL 1.16 takes from a GPU are replaced, and only those: its tree attention's flash-attention kernel
(downloaded from the Hub; `trl_cpu_attention` computes the same function with torch) and its peak-FLOPs lookup for
MFU (`torch.cuda.get_device_name`; None disables only the MFU metric, as TRL does for an unknown device)."""

import os

import pytest

import tracegym as tg
from tracegym.interop.trl import environment_factory, reward_functions, train_dataset
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

pytestmark = pytest.mark.slow
STEPS = 2


@pytest.fixture
def on_cpu(monkeypatch):
    """TRL's two GPU-only lookups, replaced (see the module docstring)."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing
    from trl_cpu_attention import KERNEL

    monkeypatch.setattr(packing, "_flash_attn", lambda: KERNEL)
    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda accelerator, dtype: None)


@pytest.fixture
def vllm_with_adapters(tmp_path):
    config = VLLMServerConfig(model=str(embedded_model_dir()), max_model_len=1024, enable_lora=True, max_lora_rank=8,
                              max_loras=4, cpu_kv_cache_gib=0.25, env={"VLLM_SERVER_DEV_MODE": "1"},
                              log_path=tmp_path / "vllm.log")
    with VLLMServer(config) as server:
        yield server


def test_async_grpo_trainer_trains_lora_steps_on_a_tracegym_taskset_and_syncs_each_to_vllm(tmp_path, on_cpu,
                                                                                            vllm_with_adapters):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import requests
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    torch.set_num_threads(1)  # beside vLLM on a 2-core machine
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    tokenizer.chat_template = qwen2_5_chat_template  # as test_trl_grpo_step: SmolLM2's template drops tool calls
    taskset = tg.load_taskset("reverse-text")
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"), vllm_server_base_url=vllm_with_adapters.base_url.removesuffix("/v1"),
        max_steps=STEPS, per_device_train_batch_size=4, num_generations=2, max_completion_length=12,
        max_tool_calling_iterations=1, learning_rate=1e-3, logging_steps=1, weight_sync_steps=1, max_staleness=1,
        use_cpu=True, bf16=False, dtype="float32", save_strategy="no", report_to="none")
    trainer = AsyncGRPOTrainer(
        model=str(embedded_model_dir()), processing_class=tokenizer, args=args,
        train_dataset=train_dataset(taskset, num_tasks=8), environment_factory=environment_factory(taskset),
        reward_funcs=reward_functions(taskset),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()

    assert trainer.state.global_step == STEPS
    assert any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in adapter.items())
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS and all(loss == loss for loss in losses)  # no NaN
    served = {m["id"] for m in requests.get(f"{vllm_with_adapters.base_url}/models", timeout=10).json()["data"]}
    assert f"trl-policy-v{STEPS}" in served  # the last version the trainer published is loaded in vLLM
