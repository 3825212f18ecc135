"""Worker death: detected quickly, requests re-dispatched (bounded) or answered with an error, never hung."""

import asyncio
import os
import signal
import time

import pytest
from serve_helpers import alive, running_server, task, wait_for, wait_ready

from tracegym.serve import EnvClient, PoolSize, RemoteError


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
