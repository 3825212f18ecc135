"""Worker pool sizes: static and elastic policies, elastic growth under load and shrinking when idle."""

import asyncio

import pytest
from pydantic import ValidationError
from serve_helpers import running_server, task, wait_for, wait_ready

from tracegym.serve import EnvClient, PoolSize


def test_static_size_is_not_elastic():
    assert not PoolSize.static(3).elastic and PoolSize.static(3).min == 3


def test_elastic_size_grows_from_one():
    size = PoolSize.elastic_up_to(4)
    assert size.elastic and (size.min, size.max) == (1, 4)


def test_max_below_min_is_refused():
    with pytest.raises(ValidationError, match="below min"):
        PoolSize(min=3, max=2)


async def test_elastic_pool_grows_with_load_and_shrinks_when_idle(endpoint):
    with running_server(size=PoolSize(min=1, max=2, grow_at=2, idle_s=0.3)) as server:
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-2.{i}"), endpoint)) for i in range(4)]
            assert await asyncio.to_thread(wait_ready, server, 2, 15)
            await asyncio.gather(*jobs)
        assert await asyncio.to_thread(wait_for, lambda: server.stats["workers_retired"] == 1, 10)
        assert len(server.pool.pids()) == 1


async def test_a_burst_moves_to_a_new_worker_once_it_is_ready(endpoint):
    with running_server(size=PoolSize(min=1, max=2, grow_at=2, idle_s=5)) as server:
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-8.{i}"), endpoint)) for i in range(4)]
            assert await asyncio.to_thread(wait_ready, server, 2, 15)
            spread = await asyncio.to_thread(
                wait_for, lambda: sorted(len(h.jobs) for h in server.pool.workers.values()) == [2, 2], 5)
            assert spread, [len(h.jobs) for h in server.pool.workers.values()]
            await asyncio.gather(*jobs)
