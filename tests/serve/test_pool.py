"""Worker pool sizes: static and elastic policies, elastic growth under load and shrinking when idle."""

import asyncio
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError
from serve_helpers import running_server, task, wait_for, wait_ready

from tracegym.serve import EnvClient, PoolSize
from tracegym.serve.pool import WorkerHandle, WorkerPool


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


def never_ready_workers(pool: WorkerPool) -> None:
    """Make `pool` start processes that never say ready (a worker stuck in its start, e.g. a hung import)."""

    def spawn() -> WorkerHandle:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        handle = WorkerHandle(name=f"w{len(pool.workers) + 1}".encode(), proc=proc, started=time.monotonic())
        pool.workers[handle.name] = handle
        return handle

    pool.spawn = spawn  # type: ignore[method-assign]


def test_requests_wait_for_a_starting_worker_only_until_its_start_times_out():
    pool = WorkerPool("echo", {}, "ipc://unused", PoolSize(min=1, max=2, grow_at=2), start_timeout=30.0)
    never_ready_workers(pool)
    try:
        busy = pool.spawn()
        pool.mark_ready(busy.name)
        pool.assign(busy, b"1")
        pool.assign(busy, b"2")
        assert not pool.scale(3)
        [starting] = [h for h in pool.workers.values() if not h.ready]
        assert pool.pick() is None  # held back for the worker the load started
        starting.started -= 31.0  # its start has now taken longer than the pool's start timeout
        assert pool.reap() == [starting]
        assert starting.proc.returncode is not None and pool.counts()["starting"] == 0
        assert pool.pick() is busy  # nothing to wait for: the busy worker takes the load
    finally:
        pool.stop_all()
