"""Worker pool sizes: static and elastic policies, elastic growth under load and shrinking when idle."""

import asyncio
import itertools
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
            # the stall outlasts a worker's start on a loaded machine (else the first worker ends them all alone)
            jobs = [asyncio.create_task(client.run(task(f"sleep-8.{i}"), endpoint)) for i in range(4)]
            assert await asyncio.to_thread(wait_ready, server, 2, 30)
            await asyncio.gather(*jobs)
        assert await asyncio.to_thread(wait_for, lambda: server.stats["workers_retired"] == 1, 10)
        assert server.pool.counts()["ready"] == 1  # and the warm spare, never retired:
        assert await asyncio.to_thread(wait_for, lambda: server.pool.counts()["spare"] == 1, 15)
        assert len(server.pool.pids()) == 2


async def test_a_burst_moves_to_a_new_worker_once_it_is_ready(endpoint):
    with running_server(size=PoolSize(min=1, max=2, grow_at=2, idle_s=5)) as server:
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-8.{i}"), endpoint)) for i in range(4)]
            assert await asyncio.to_thread(wait_ready, server, 2, 30)
            spread = await asyncio.to_thread(  # the workers with requests (the new spare behind them has none)
                wait_for, lambda: sorted(len(h.jobs) for h in server.pool.workers.values() if h.jobs) == [2, 2], 5)
            assert spread, [len(h.jobs) for h in server.pool.workers.values()]
            await asyncio.gather(*jobs)


def never_ready_workers(pool: WorkerPool) -> None:
    """Make `pool` start processes that never say ready (a worker stuck in its start, e.g. a hung import)."""

    names = itertools.count(1)

    def spawn() -> WorkerHandle:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        handle = WorkerHandle(name=f"w{next(names)}".encode(), proc=proc, started=time.monotonic())
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


# --- warm spares --------------------------------------------------------------------------------------------------
def sleeping_pool(size: PoolSize) -> WorkerPool:
    """A pool whose workers are `sleep` processes, made ready by hand."""
    pool = WorkerPool("echo", {}, "ipc://unused", size)
    never_ready_workers(pool)
    return pool


def ready_all(pool: WorkerPool) -> None:
    for handle in list(pool.workers.values()):
        if not handle.ready:
            pool.mark_ready(handle.name)


def test_a_spare_starts_once_the_pool_is_ready_and_is_never_given_work():
    pool = sleeping_pool(PoolSize(min=2))
    try:
        pool.scale(0)
        assert len(pool.workers) == 2  # the pool's own first: the spare would only slow their start
        pool.scale(0)
        assert len(pool.workers) == 2
        ready_all(pool)
        pool.scale(0)
        [spare] = [h for h in pool.workers.values() if not h.ready]
        pool.mark_ready(spare.name)
        assert spare.spare and pool.counts()["ready"] == 2 and pool.counts()["spare"] == 1
        for n in range(10):
            handle = pool.pick()
            assert handle is not None and handle is not spare
            pool.assign(handle, bytes([n]))
        assert pool.spare_pids() == [spare.proc.pid]
    finally:
        pool.stop_all()


def test_a_spare_takes_a_dead_workers_place_at_once_and_a_new_spare_starts_behind_it():
    pool = sleeping_pool(PoolSize(min=2))
    try:
        pool.scale(0)
        ready_all(pool)
        pool.scale(0)
        ready_all(pool)
        [spare] = [h for h in pool.workers.values() if h.spare]
        dead = next(h for h in pool.workers.values() if not h.spare)
        dead.proc.kill()
        dead.proc.wait()
        assert pool.reap() == [dead]
        pool.scale(0)
        assert not spare.spare and pool.counts()["ready"] == 2 and pool.promoted == 1  # no wait for a start
        [fresh] = [h for h in pool.workers.values() if not h.ready]  # the new spare, behind it
        pool.mark_ready(fresh.name)
        assert fresh.spare and pool.counts() == {"ready": 2, "starting": 0, "retiring": 0, "isolating": 0,
                                                 "spare": 1}
    finally:
        pool.stop_all()


def test_a_growing_elastic_pool_takes_its_next_worker_from_the_spares():
    pool = sleeping_pool(PoolSize(min=1, max=3, grow_at=2))
    try:
        pool.scale(0)
        ready_all(pool)
        pool.scale(0)
        ready_all(pool)
        assert pool.counts()["ready"] == 1 and pool.counts()["spare"] == 1
        pool.scale(3)  # 3 requests at 2 per worker: two workers
        assert pool.counts()["ready"] == 2 and pool.counts()["spare"] == 0 and pool.counts()["starting"] == 1
    finally:
        pool.stop_all()


def test_a_pool_without_spares_starts_none():
    pool = sleeping_pool(PoolSize(min=1, spares=0))
    try:
        pool.scale(0)
        ready_all(pool)
        pool.scale(0)
        assert len(pool.workers) == 1 and pool.counts()["spare"] == 0
    finally:
        pool.stop_all()
