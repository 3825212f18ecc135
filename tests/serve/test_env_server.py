"""Env server request/reply: every method, timeouts, cancel, malformed and oversized frames."""

import asyncio
import os
import socket

import pytest
import zmq
from serve_helpers import running_server, task, wait_for

from tracegym import InfrastructureError, TaskData, UsageError
from tracegym.core.errors import StageTimeout
from tracegym.serve import EnvClient, RemoteError
from tracegym.serve.env_client import same_task_runs
from tracegym.serve.wire import decode_reply
from tracegym.testing.echo import Echo


async def test_health_reports_ready_workers(server):
    # the spare starts once the pool is ready (seconds later on a loaded machine): not ready, it is not in "spares"
    assert await asyncio.to_thread(wait_for, lambda: server.pool.counts()["spare"] == 1, 30)
    async with EnvClient(server.bound) as client:
        health = await client.health()
    assert health["ok"] and health["workers"]["ready"] == 1 and len(set(health["pids"]) - set(health["spares"])) == 1


async def test_info_describes_the_taskset(server):
    async with EnvClient(server.bound) as client:
        info = await client.info()
    assert (info["taskset"], info["finite"], info["workers"]) == ("echo", True, 1)
    assert info["task_type"] == "tracegym.testing.echo.EchoTask"


async def test_run_returns_one_scored_trace_per_rollout_index(server, endpoint):
    async with EnvClient(server.bound) as client:
        traces = await client.run(task("hello"), endpoint, rollout_indices=[0, 3])
    assert [t.rollout_index for t in traces] == [0, 3]
    assert [t.reward for t in traces] == [1.0, 1.0]


async def test_run_with_a_bad_payload_is_a_bad_request(server):
    async with EnvClient(server.bound) as client:
        with pytest.raises(RemoteError) as caught:
            await client.request("run", {"data": 3})
    assert caught.value.type == "BadRequest"


async def test_evaluate_iter_yields_every_pair(server, endpoint):
    pairs = [(task(f"w{i}"), r) for i in range(5) for r in range(2)]
    async with EnvClient(server.bound) as client:
        traces = [t async for t in client.evaluate_iter(Echo(), endpoint, pairs=pairs, concurrency=4)]
    assert sorted((t.task_key, t.rollout_index) for t in traces) == sorted((d.key, r) for d, r in pairs)
    assert all(t.ok for t in traces)


async def test_evaluate_iter_sends_the_rollouts_of_one_task_in_one_request(server, endpoint):
    pairs = [(task(f"g{i}"), r) for i in range(3) for r in range(4)]
    before = server.stats["run_requests"]
    async with EnvClient(server.bound, per_request=4) as client:
        traces = [t async for t in client.evaluate_iter(Echo(), endpoint, pairs=pairs, concurrency=8)]
    assert server.stats["run_requests"] - before == 3
    assert sorted((t.task_key, t.rollout_index) for t in traces) == sorted((d.key, r) for d, r in pairs)


async def test_evaluate_iter_splits_a_task_s_rollouts_beyond_per_request(server, endpoint):
    pairs = [(task("many"), r) for r in range(5)]
    before = server.stats["run_requests"]
    async with EnvClient(server.bound, per_request=2) as client:
        traces = [t async for t in client.evaluate_iter(Echo(), endpoint, pairs=pairs)]
    assert server.stats["run_requests"] - before == 3 and len(traces) == 5


async def test_a_failed_group_request_is_a_failed_trace_per_rollout(server, endpoint):
    async with EnvClient(server.bound, request_timeout=0.3) as client:
        pairs = [(task("sleep-2"), 0), (task("sleep-2"), 1)]
        traces = [t async for t in client.evaluate_iter(Echo(), endpoint, pairs=pairs)]
    assert sorted(t.rollout_index for t in traces) == [0, 1]
    assert all(t.errors[0].kind == "timeout" for t in traces)


async def test_cancel_answers_the_cancelled_request(server, endpoint):
    async with EnvClient(server.bound) as client:
        job = asyncio.create_task(client.run(task("sleep-2"), endpoint, request_id="slow-1"))
        await asyncio.to_thread(wait_for, lambda: server.inflight, 5)
        assert await client.cancel("slow-1") is True
        with pytest.raises(RemoteError) as caught:
            await job
    assert caught.value.type == "Cancelled"


async def test_cancel_of_an_unknown_request_says_so(server):
    async with EnvClient(server.bound) as client:
        assert await client.cancel("never-sent") is False


async def test_cancelling_the_awaiting_task_cancels_on_the_server(server, endpoint):
    async with EnvClient(server.bound) as client:
        job = asyncio.create_task(client.run(task("sleep-2"), endpoint))
        await asyncio.to_thread(wait_for, lambda: server.inflight, 5)
        job.cancel()
        assert await asyncio.to_thread(wait_for, lambda: not server.inflight, 5)


async def test_request_timeout_raises_and_frees_the_server(server, endpoint):
    async with EnvClient(server.bound, request_timeout=0.3) as client:
        with pytest.raises(StageTimeout):
            await client.run(task("sleep-2"), endpoint)
    assert await asyncio.to_thread(wait_for, lambda: not server.inflight, 5)


async def test_timed_out_request_in_evaluate_iter_is_a_failed_trace(server, endpoint):
    async with EnvClient(server.bound, request_timeout=0.3) as client:
        pairs = [(task("sleep-2"), 0), (task("fine"), 0)]
        traces = [t async for t in client.evaluate_iter(Echo(), endpoint, pairs=pairs)]
    by_key = {t.task_key: t for t in traces}
    assert by_key["fine"].ok and by_key["sleep-2"].errors[0].kind == "timeout"


async def test_garbage_bytes_on_the_tcp_port_do_not_stop_the_server(server):
    host, port = server.bound.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(os.urandom(4096))
    async with EnvClient(server.bound) as client:
        assert (await client.health())["ok"]


def test_a_malformed_frame_gets_an_error_reply_and_is_counted(server):
    before = server.stats["malformed"]
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.bound)
        sock.send_multipart([b"\xc1garbage", b"more", b"frames"])
        assert sock.poll(5000)
        request_id, error = decode_reply(sock.recv_multipart())
    assert request_id is None and isinstance(error, RemoteError) and error.type == "BadRequest"
    assert server.stats["malformed"] == before + 1


async def test_an_oversized_request_is_refused_with_the_servers_limit(endpoint):
    with running_server(max_request_bytes=100_000) as small:
        async with EnvClient(small.bound) as client:  # it asks the server's limit before sending past 64 KiB
            with pytest.raises(UsageError, match="100000-byte limit"):
                await client.run(TaskData(prompt="x" * 150_000), endpoint)
            assert (await client.health())["ok"]


async def test_the_client_refuses_a_request_over_its_own_limit(server, endpoint):
    async with EnvClient(server.bound, max_request_bytes=1000) as client:
        with pytest.raises(UsageError, match="limit"):
            await client.run(TaskData(prompt="x" * 2000), endpoint)


async def test_a_server_that_is_not_there_fails_fast():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with EnvClient(f"tcp://127.0.0.1:{port}", liveness_timeout=0.5) as client:
        with pytest.raises(InfrastructureError, match="did not answer"):
            await client.health()


def test_same_task_runs_group_consecutive_pairs_of_one_task():
    a, b = task("a"), task("b")
    pairs = [(a, 0), (a, 1), (a, 2), (b, 0), (a, 3)]
    runs = [[i for _, i in run] for run in same_task_runs(pairs, 2)]
    assert runs == [[0, 1], [2], [0], [3]]


async def test_a_cancel_right_behind_its_run_is_still_answered(server, endpoint):
    async with EnvClient(server.bound) as client:
        for n in range(5):  # run and cancel reach the worker together: the job is cancelled before it starts
            job = asyncio.create_task(client.run(task("sleep-2"), endpoint, request_id=f"quick-{n}"))
            await asyncio.sleep(0)
            await client.cancel(f"quick-{n}")
            with pytest.raises(RemoteError) as caught:
                await asyncio.wait_for(job, 5)
            assert caught.value.type == "Cancelled"


async def test_a_request_lost_to_a_server_restart_fails_at_the_next_ping(endpoint):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    client = EnvClient(address, liveness_timeout=30)
    try:
        with running_server(address=address) as first:
            job = asyncio.create_task(client.run(task("sleep-5"), endpoint))
            await asyncio.to_thread(wait_for, lambda: first.inflight, 5)
        with running_server(address=address), pytest.raises(InfrastructureError, match="no record"):
            await asyncio.wait_for(job, 10)  # the new server answers pings but never saw the request
    finally:
        await client.aclose()


def test_the_server_never_imports_the_worker_module_which_workers_run_as_main():
    """`python -m tracegym.serve.worker` warns (and may misbehave) when the module was imported before it ran."""
    import subprocess
    import sys

    code = "import sys, tracegym.serve; print('tracegym.serve.worker' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
