"""The orchestrator of an `opd` run against a real local env server and the fake OpenAI server: every sample gets
the teacher's per-token advantages, groups without reward signal are kept, and the step logs its KL."""

import asyncio
import math

import pytest
from test_distillation import TableTeacher
from test_orchestrator import collect

from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.distillation import Distiller, OPDConfig, OPDSignal
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for


@pytest.fixture(scope="module")
def env_addresses():
    with local_server("reverse-text", {"seed": 0}, workers=1) as train:
        yield {"reverse-text": train}


def test_an_opd_step_gives_every_sampled_token_the_teachers_advantage(tmp_path, env_addresses):
    config = RLConfig.model_validate({
        "mode": "opd", "teacher": {"name": "teacher"}, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 2, "group_size": 4, "max_async_steps": 0}})
    with FakeOpenAIServer(rule=lambda r: "same answer") as server:  # no reward signal at all
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs=env_addresses,
                              teacher_base_url=[server.base_url], teacher_model=server.model)
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)
        signal = orchestrator.signal
        assert isinstance(signal, OPDSignal) and signal.distiller is not None  # the vLLM teacher at the endpoint
        teacher = TableTeacher()  # scored here by a table
        signal.distiller = Distiller(teacher, OPDConfig())
        samples, metrics = asyncio.run(collect(orchestrator))
    assert len(samples) == 8 and metrics["groups_filtered"] == 0  # kept: the teacher's signal is per token
    assert sorted(teacher.scored) == sorted(s.token_ids for s in samples)
    for sample in samples:
        expected = [-math.log(t + 1) - lp if m else 0.0
                    for t, lp, m in zip(sample.token_ids, sample.logprobs, sample.loss_mask, strict=True)]
        assert sample.token_advantages == pytest.approx(expected)
    assert metrics["opd/tokens"] == sum(s.num_trained for s in samples) and "opd/kl" in metrics
    assert teacher.closed
