"""The env client's run calls check, once per taskset, that the server runs the taskset they were given."""

import asyncio

import pytest
from serve_helpers import task

import tracegym as tg
from tracegym.serve import EnvClient
from tracegym.testing.echo import Echo


class CountingClient(EnvClient):
    """An EnvClient that counts its `info` requests (the check's one round trip)."""

    infos = 0

    async def info(self, address: str | None = None) -> dict:
        self.infos += 1
        return await super().info(address)


async def test_a_server_running_other_options_is_refused_before_any_rollout(server, endpoint):
    async with EnvClient(server.bound) as env:
        for run in (lambda ts: env.run_rollout(ts, task(), endpoint), lambda ts: env.run_group(ts, task(), endpoint, 2),
                    lambda ts: env.evaluate(ts, endpoint, num_tasks=1)):
            with pytest.raises(tg.UsageError, match=r"runs 'echo' with num_tasks = 100, not 3"):
                await run(Echo({"num_tasks": 3}))


async def test_the_check_is_made_once_per_taskset_and_config_per_client(server, endpoint):
    async with CountingClient(server.bound) as env:
        await asyncio.gather(*(env.run_group(Echo(), task(), endpoint, 2) for _ in range(3)))
        await env.run_rollout(Echo(), task(), endpoint)
        await env.evaluate(Echo(), endpoint, num_tasks=2)
        assert env.infos == 1
        with pytest.raises(tg.UsageError):
            await env.run_rollout(Echo({"turns": 2}), task(), endpoint)
        assert env.infos == 2
