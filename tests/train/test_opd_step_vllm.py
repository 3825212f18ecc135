"""Slow: one real on-policy distillation step on the embedded model. vLLM samples the student's rollouts (exact
tokens), the same vLLM scores those tokens as the teacher (`prompt_logprobs`), transformers scores them too (the
fallback), and the trainer steps on the per-token advantages. Teacher = student, so what is true is: the per-token
KL is ~0 (both sides are vLLM's bfloat16 logprobs of the same weights), transformers' float32 scores agree with
vLLM's to bfloat16 precision, and the step's loss is ~0."""

import statistics

import pytest

import tracegym as tg
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.distillation import Distiller, OPDConfig
from tracegym.train.samples import trace_samples
from tracegym.train.teacher import TransformersTeacher, VLLMTeacher
from tracegym.train.trainer import TrainerConfig, build_trainer

pytestmark = pytest.mark.slow


async def test_one_opd_step_with_the_student_as_its_own_teacher(tmp_path):
    model_dir = str(embedded_model_dir())
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=1024,
                              cpu_kv_cache_gib=0.25)
    with VLLMServer(config) as server:
        endpoint = tg.Endpoint(base_url=server.base_url, model=SERVED_MODEL_NAME, api_key_env=None, tokens="on")
        async with ChatClient(endpoint) as client:
            traces = await tg.evaluate("reverse-text", client, num_tasks=2, rollouts=4,
                                       sampling=tg.Sampling(temperature=1.0, max_tokens=16))
        samples = [s for t in traces for s in trace_samples(t)]
        distiller = Distiller(VLLMTeacher(endpoint), OPDConfig())
        distilled, metrics = await distiller(samples)
        await distiller.aclose()

    assert len(distilled) == 8 and metrics["opd/tokens"] == sum(s.num_trained for s in samples)
    assert abs(metrics["opd/kl"]) < 0.05, metrics  # the teacher is the student
    assert metrics["opd/teacher_logprob"] < -0.1  # ... and sampling at temperature 1 picked unlikely tokens too
    advantages = [a for s in distilled for a, m in zip(s.token_advantages, s.loss_mask, strict=True) if m]
    assert statistics.fmean(abs(a) for a in advantages) < 0.1

    fallback = TransformersTeacher(model_dir)  # float32 here, bfloat16 in vLLM
    vllm_scores = [a + lp for s in distilled  # advantage = teacher - student, so teacher = advantage + student
                   for a, lp, m in zip(s.token_advantages, s.logprobs, s.loss_mask, strict=True) if m]
    local_scores = [lp for s in samples
                    for lp, m in zip(await fallback.logprobs(s.token_ids), s.loss_mask[1:], strict=True) if m]
    assert statistics.fmean(abs(a - b) for a, b in zip(vllm_scores, local_scores, strict=True)) < 0.1

    trainer = build_trainer(TrainerConfig(model=model_dir, num_threads=2, gradient_checkpointing=False))
    step = trainer.step(distilled)
    assert step["tokens"] == metrics["opd/tokens"]
    assert abs(step["loss"]) < 0.1 and step["version"] == 1.0
