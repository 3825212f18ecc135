"""The orchestrator drops and counts the traces `validate` rejects instead of training on them or crashing."""

import asyncio
import json

import pytest

from tracegym.serve.env_client import EnvClient
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer
from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig


@pytest.fixture(scope="module")
def env_address():
    with local_server("reverse-text", {"seed": 0}, workers=1) as address:
        yield address


async def collect(orchestrator: Orchestrator):
    orchestrator.clients = {k: EnvClient(a) for k, a in orchestrator.env_addresses.items()}
    try:
        return await orchestrator.collect(0, 0, orchestrator.base_model)
    finally:
        for client in orchestrator.clients.values():
            await client.aclose()


def test_greedy_rollouts_are_dropped_and_counted_not_trained(tmp_path, env_address):
    calls = iter(range(1000))
    config = RLConfig.model_validate({
        "steps": 1, "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 1, "group_size": 4, "max_async_steps": 0,
                         "train": {"sampling": {"temperature": 0.0}}}})
    with FakeOpenAIServer(rule=lambda r: r.messages[-1].text[::-1] if next(calls) % 2 else "no") as server:
        orchestrator = Orchestrator(config, tmp_path, server.base_url, server.model, {"reverse-text": env_address})
        samples, metrics = asyncio.run(collect(orchestrator))
    assert samples == [] and metrics["rollouts"] == 4 and metrics["traces_invalid"] == 4
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("greedy" in r["invalid_trace"] for r in logged if "invalid_trace" in r) and len(logged) == 4
