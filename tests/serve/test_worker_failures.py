"""Worker death: detected quickly, requests re-dispatched (bounded) or answered with an error, never hung."""

import asyncio
import os
import signal
import subprocess
import time

import pytest
from serve_helpers import alive, running_server, task, wait_for, wait_ready

from tracegym.serve import EnvClient, EnvServer, PoolSize, RemoteError
from tracegym.serve.env_server import InFlight
from tracegym.serve.pool import WorkerHandle
from tracegym.testing.echo import SPEC


async def test_requests_on_a_killed_worker_are_all_answered(endpoint):
    with running_server(size=PoolSize(min=1)) as server:
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-1.{i}"), endpoint)) for i in range(4)]
            await asyncio.to_thread(wait_for, lambda: len(server.inflight) == 4 and not server.pending, 5)
            os.kill(server.pool.pids()[0], signal.SIGKILL)
            traces = await asyncio.wait_for(asyncio.gather(*jobs), 20)
        assert all(t[0].ok for t in traces)
        assert server.stats["workers_died"] == 1 and server.stats["redispatched"] == 4


def test_a_dead_worker_is_detected_and_replaced_within_a_second():
    with running_server(size=PoolSize(min=1)) as server:
        pid = server.pool.pids()[0]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: pid not in server.pool.pids(), 2)
        noticed = time.monotonic() - killed
        assert wait_ready(server, 1)
        assert noticed < 1.0 and server.pool.pids()[0] != pid and not alive(pid)


async def test_a_request_that_keeps_killing_workers_gets_an_infrastructure_error(endpoint):
    with running_server({"exit_in_setup": True}, max_redispatch=1) as server:
        async with EnvClient(server.bound) as client:
            with pytest.raises(RemoteError) as caught:
                await asyncio.wait_for(client.run(task(), endpoint), 30)
        assert caught.value.type == "WorkerDied" and caught.value.kind == "infrastructure"
        assert server.stats["workers_died"] == 2


async def test_a_hung_worker_is_killed_and_its_request_answered_by_a_replacement(endpoint):
    with running_server(size=PoolSize(min=1), worker_timeout=1.0) as server:
        async with EnvClient(server.bound) as client:
            job = asyncio.create_task(client.run(task("sleep-0.5"), endpoint))
            await asyncio.to_thread(wait_for, lambda: server.inflight and not server.pending, 5)
            hung = server.pool.pids()[0]
            os.kill(hung, signal.SIGSTOP)  # alive but answering nothing
            [trace] = await asyncio.wait_for(job, 20)
        assert trace.ok and not alive(hung)
        assert server.stats["workers_hung"] == 1 and server.stats["redispatched"] == 1
        assert server.stats["workers_retired"] == 0 and server.stats["workers_died"] == 0  # counted once, as hung


def test_a_request_the_worker_no_longer_holds_is_redispatched():
    server = EnvServer(SPEC, {}, size=PoolSize(min=1))
    server.bind()  # no serve loop: the test drives the bookkeeping by hand
    handle = WorkerHandle(b"w9", subprocess.Popen(["sleep", "30"]), started=time.monotonic(), ready=True)
    server.pool.workers[handle.name] = handle
    try:
        key = b"k" * 8
        server.inflight[key] = InFlight(b"client", "r1", b"{}", worker=handle.name)
        handle.jobs.add(key)
        handle.audit = {key}
        server._audited(handle.name, held=set())
        assert server.stats["lost_by_worker"] == 1 and server.stats["redispatched"] == 1
        assert server.inflight[key].attempts == 1 and list(server.pending) == [key]  # w9 is not connected
    finally:
        server._shutdown()


async def test_a_busy_healthy_worker_passes_every_check(endpoint):
    with running_server(size=PoolSize(min=1), worker_timeout=0.4) as server:  # asked every 0.1 s
        async with EnvClient(server.bound) as client:
            [trace] = await asyncio.wait_for(client.run(task("sleep-1"), endpoint), 10)
        assert trace.ok
        assert (server.stats["workers_hung"], server.stats["lost_by_worker"], server.stats["redispatched"]) == (0, 0, 0)
