"""Slow: one real SFT step on the embedded model: the oracle teacher over HTTP answers a real env server's rollouts
(chat client), the orchestrator renders them with SmolLM2's own renderer, and the trainer's cross-entropy step
makes the teacher's answers more likely."""

import asyncio
import math
import statistics

import pytest

from tracegym.core.trace import Trace
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.renderer import load_renderer
from tracegym.serve.local_server import local_server
from tracegym.testing.oracle import oracle_server
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.trainer import build_trainer

pytestmark = pytest.mark.slow


def mean_nll(trainer, samples) -> float:
    """The trainer's mean negative logprob of the samples' loss tokens."""
    values = [-lp for s, lps in zip(samples, trainer.logprobs(samples), strict=True)
              for lp, m in zip(lps, s.loss_mask, strict=True) if m]
    return statistics.fmean(values)


def test_one_sft_step_learns_the_teachers_answers(tmp_path):
    model_dir = str(embedded_model_dir())
    config = RLConfig.model_validate({
        "mode": "sft", "steps": 1, "model": {"client": "chat"},
        "trainer": {"model": model_dir, "learning_rate": 1e-3, "num_threads": 2, "gradient_checkpointing": False},
        "sft": {"min_reward": 1.0},
        "orchestrator": {"tasks_per_step": 4, "group_size": 2, "max_async_steps": 0,
                         "train": {"envs": [{"id": "reverse-text", "options": {"seed": 0, "reward": "exact"}}]}},
        "teacher": {"base_url": "http://127.0.0.1:1/v1"}})  # where endpoints.json says the teacher is, below
    with oracle_server("reverse-text", [{"seed": 0}]) as teacher, \
            local_server("reverse-text", {"seed": 0, "reward": "exact"}, workers=1) as env:
        endpoints = Endpoints(base_url="http://127.0.0.1:1/v1", base_model=SERVED_MODEL_NAME,
                              envs={"reverse-text": env}, teacher_base_url=[teacher.base_url])
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def collect():
            try:
                return await orchestrator.collect(0, 0, SERVED_MODEL_NAME)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(collect())
    assert metrics["sft/kept"] == 8 and metrics["rollouts"] == 8 and len(samples) == 8
    renderer = load_renderer(model_dir)
    lines = (tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()
    traces = {t.id: t for t in map(Trace.model_validate_json, lines)}
    for sample in samples:  # loss on the teacher's answer (and the turn's close), nothing else
        trained = renderer.decode([t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m])
        assert trained == f"{traces[sample.trace_id].task.answer}<|im_end|>"

    trainer = build_trainer(config.trainer)
    assert trainer.config.objective == "cross_entropy"
    before = mean_nll(trainer, samples)
    metrics = trainer.step(samples)
    after = mean_nll(trainer, samples)
    assert metrics["loss"] == pytest.approx(before, rel=0.05), (metrics["loss"], before)  # the mean NLL
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"])) and "ratio_mean" not in metrics
    assert 0.0 < metrics["token_accuracy"] < 1.0  # the base model already predicts some reversed letters
    assert after < 0.9 * before, f"mean NLL of the teacher's answers {before:.3f} -> {after:.3f}"
