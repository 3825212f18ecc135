"""The orchestrator drops and counts the traces `validate` rejects instead of training on them or crashing."""

import asyncio
import json

import pytest

from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for


@pytest.fixture(scope="module")
def env_address():
    with local_server("reverse-text", {"seed": 0}, workers=1) as address:
        yield address


async def collect(orchestrator: Orchestrator):
    try:
        return await orchestrator.collect(0, 0, orchestrator.endpoint.model)
    finally:
        await orchestrator.aclose()


def test_greedy_rollouts_are_dropped_and_counted_not_trained(tmp_path, env_address):
    calls = iter(range(1000))
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 1, "group_size": 4, "max_async_steps": 0,
                         "train": {"sampling": {"temperature": 0.0}}}})
    with FakeOpenAIServer(rule=lambda r: r.messages[-1].text[::-1] if next(calls) % 2 else "no") as server:
        endpoints = Endpoints(base_url=server.base_url, base_model=server.model, envs={"reverse-text": env_address})
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)
        samples, metrics = asyncio.run(collect(orchestrator))
    assert samples == [] and metrics["rollouts"] == 4 and metrics["traces_invalid"] == 4
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("greedy" in r["invalid_trace"] for r in logged if "invalid_trace" in r) and len(logged) == 4
