"""Worker death: detected quickly, requests re-dispatched (bounded) or answered with an error, never hung."""

import asyncio
import os
import signal
import subprocess
import time

import pytest
from serve_helpers import alive, running_server, task, wait_for, wait_ready

from tracegym import TaskData, Trace
from tracegym.envs.registry import load_taskset
from tracegym.serve import EnvClient, EnvServer, PoolSize, RemoteError
from tracegym.serve.env_server import InFlight
from tracegym.serve.pool import WorkerHandle
from tracegym.serve.run_request import RunRequest
from tracegym.serve.wire import pack
from tracegym.serve.worker import Worker
from tracegym.serve.worker_protocol import CANCEL, REPLACE, REPLY, RUN, STOP
from tracegym.testing.echo import SPEC


async def test_requests_on_a_killed_worker_are_all_answered(endpoint):
    with running_server(size=PoolSize(min=1)) as server:
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-1.{i}"), endpoint)) for i in range(4)]
            await asyncio.to_thread(wait_for, lambda: len(server.inflight) == 4 and not server.pending, 30)
            os.kill(server.pool.pids()[0], signal.SIGKILL)
            traces = await asyncio.wait_for(asyncio.gather(*jobs), 60)
        assert all(t[0].ok for t in traces)
        assert server.stats["workers_died"] == 1 and server.stats["redispatched"] == 4


def test_a_dead_worker_is_detected_and_replaced_without_waiting_for_the_worker_timeout():
    with running_server(size=PoolSize(min=1)) as server:  # worker_timeout 60 s: noticed long before it
        pid = server.pool.pids()[0]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: pid not in server.pool.pids(), 30)
        noticed = time.monotonic() - killed
        assert wait_ready(server, 1, 30)
        assert noticed < 15 and server.pool.pids()[0] != pid and not alive(pid)


async def test_a_request_that_keeps_killing_the_worker_it_runs_on_alone_gets_a_task_error(endpoint):
    with running_server({"exit_in_setup": True}, max_redispatch=1) as server:
        async with EnvClient(server.bound) as client:
            with pytest.raises(RemoteError) as caught:
                await asyncio.wait_for(client.run(task(), endpoint), 30)
        assert caught.value.type == "WorkerDied" and caught.value.kind == "task"  # its own code ends the process
        assert server.stats["workers_died"] == 2


async def test_a_hung_worker_is_killed_and_its_request_answered_by_a_replacement(endpoint):
    with running_server(size=PoolSize(min=1), worker_timeout=3.0) as server:  # a loaded machine's lag is not a hang
        async with EnvClient(server.bound) as client:
            job = asyncio.create_task(client.run(task("sleep-0.5"), endpoint))
            await asyncio.to_thread(wait_for, lambda: server.inflight and not server.pending, 30)
            hung = server.pool.pids()[0]
            os.kill(hung, signal.SIGSTOP)  # alive but answering nothing
            [trace] = await asyncio.wait_for(job, 60)
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
        assert server.inflight[key].lost == 1 and list(server.pending) == [key]  # w9 is not connected
    finally:
        server._shutdown()


async def test_a_busy_healthy_worker_passes_every_check(endpoint):
    with running_server(size=PoolSize(min=1), worker_timeout=2.0) as server:  # asked every 0.5 s
        async with EnvClient(server.bound) as client:
            [trace] = await asyncio.wait_for(client.run(task("sleep-3"), endpoint), 60)
        assert trace.ok
        assert (server.stats["workers_hung"], server.stats["lost_by_worker"], server.stats["redispatched"]) == (0, 0, 0)


# --- a poison request: one that kills every worker it runs on ----------------------------------------------
def fake_worker(server: EnvServer, name: bytes, *keys: bytes) -> WorkerHandle:
    """A ready worker (a `sleep` process standing in) holding `keys`, assigned through the pool."""
    handle = WorkerHandle(name, subprocess.Popen(["sleep", "30"]), started=time.monotonic(), ready=True)
    server.pool.workers[name] = handle
    for key in keys:
        server.inflight.setdefault(key, InFlight(b"client", key.decode(), b"{}"))
        server.inflight[key].worker = name
        server.pool.assign(handle, key)
    return handle


def dies(server: EnvServer, handle: WorkerHandle) -> None:
    """What supervision does when the worker's process is found dead."""
    handle.proc.kill()
    handle.proc.wait()
    del server.pool.workers[handle.name]
    server._worker_exited(handle)


@pytest.fixture
def unserved():
    server = EnvServer(SPEC, {}, size=PoolSize(min=1), max_redispatch=1)
    server.bind()  # no serve loop: the test drives the bookkeeping by hand
    try:
        yield server
    finally:
        server._shutdown()


def test_requests_of_a_worker_that_died_shared_become_suspects_and_none_is_blamed(unserved):
    dies(unserved, fake_worker(unserved, b"w8", b"a", b"b", b"c", b"d", b"e"))
    assert [r.kills for r in unserved.inflight.values()] == [0] * 5  # all still owed a reply
    assert all(r.suspect and r.worker is None for r in unserved.inflight.values())
    assert [list(g) for g in unserved.suspects] == [[b"a", b"b", b"c", b"d", b"e"]]  # together, on a worker alone
    assert not unserved.pending and unserved.stats["redispatched"] == 5


def test_suspects_whose_isolated_worker_died_too_rerun_in_halves(unserved):
    dies(unserved, fake_worker(unserved, b"w8", b"a", b"b", b"c", b"d", b"e"))
    unserved.suspects.clear()
    dies(unserved, fake_worker(unserved, b"w9", b"a", b"b", b"c", b"d", b"e"))  # the group killed it: halves
    assert [list(g) for g in unserved.suspects] == [[b"a", b"b", b"c"], [b"d", b"e"]]
    assert [r.kills for r in unserved.inflight.values()] == [0] * 5


def test_a_request_that_kills_the_worker_it_ran_alone_on_is_failed_after_its_own_retries(unserved):
    dies(unserved, fake_worker(unserved, b"w8", b"p", b"x"))  # shared: no blame
    dies(unserved, fake_worker(unserved, b"w9", b"p"))  # alone: blamed once (max_redispatch=1: one retry)
    assert (unserved.inflight[b"p"].kills, unserved.inflight[b"x"].kills) == (1, 0)
    dies(unserved, fake_worker(unserved, b"w10", b"p"))
    assert b"p" not in unserved.inflight and unserved.stats["poison_requests"] == 1
    assert unserved.inflight[b"x"].kills == 0 and b"x" in {k for g in unserved.suspects for k in g}


def poison_pairs(n: int, rollouts: int, poison_at: int) -> list[tuple[TaskData, int]]:
    """`n` tasks of `rollouts` rollouts each, the fake model stalling 0.2 s on each (so many are in flight on a
    worker when the poison kills it); task number `poison_at` is the poison."""
    rows = [TaskData(id=f"t{i}", prompt="Say sleep-0.2.", answer="sleep-0.2") for i in range(n)]
    rows[poison_at] = TaskData(id="poison", prompt="Say hello.", answer="hello")
    return [(row, i) for row in rows for i in range(rollouts)]


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_poison_task_fails_only_its_own_rollouts_and_the_pool_keeps_serving(endpoint, workers):
    options = {"poison_task": "poison"}
    with running_server(options, size=PoolSize(min=workers), max_redispatch=1) as server:
        async with EnvClient(server.bound, per_request=2) as client:
            pairs = poison_pairs(30, 2, poison_at=11)
            traces = [t async for t in client.evaluate_iter(load_taskset(SPEC, options), endpoint, pairs=pairs,
                                                            concurrency=60)]
            [after] = await client.run(task("after"), endpoint)
            health = await client.health()
        whole = await asyncio.to_thread(wait_for, lambda: server.pool.counts()["ready"] == workers, 30)
    failed = sorted(t.task.id for t in traces if not t.ok)
    assert failed == ["poison", "poison"] and len(traces) == 60 and after.ok
    poison = next(t for t in traces if not t.ok)
    assert poison.failure == "worker_died" and "alone, 2 times" in poison.errors[0].message
    assert health["stats"]["poison_requests"] == 1 and health["stats"]["workers_died"] >= 2
    assert (health["in_flight"], health["queued"], health["suspects"]) == (0, 0, 0)
    assert (health["workers"]["retiring"], health["workers"]["isolating"]) == (0, 0) and whole  # (once started)


@pytest.mark.parametrize("how", ["segfault", "kill"])
async def test_a_task_that_segfaults_or_is_killed_like_by_the_oom_killer_costs_only_its_request(endpoint, how):
    traces, server = await six_rollouts_one_poisoned(endpoint, how)
    assert sorted(t.task.id for t in traces if not t.ok) == ["poison"] and len(traces) == 6
    assert server.stats["poison_requests"] == 1


async def test_a_task_whose_interrupt_stops_the_worker_loop_costs_only_its_request(endpoint):
    traces, _ = await six_rollouts_one_poisoned(endpoint, "interrupt")  # the worker's loop ends, cancelling the rest
    assert sorted(t.task.id for t in traces if not t.ok) == ["poison"] and len(traces) == 6


async def six_rollouts_one_poisoned(endpoint, how: str) -> tuple[list[Trace], EnvServer]:
    """Six one-rollout requests through a one-worker pool that never redispatches; the third task's code ends
    its worker `how`. The traces as they finished, and the (stopped) server for its stats."""
    options = {"poison_task": "poison", "poison_how": how}
    with running_server(options, size=PoolSize(min=1), max_redispatch=0) as server:
        async with EnvClient(server.bound, per_request=1) as client:
            pairs = poison_pairs(6, 1, poison_at=2)
            traces = [t async for t in client.evaluate_iter(load_taskset(SPEC, options), endpoint, pairs=pairs,
                                                            concurrency=6)]
    return traces, server


class RecordingSocket:
    """Stands in for a worker's socket: records the kind and key of each message it sends."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send(self, frames: list[bytes], copy: bool = True) -> None:
        self.sent.append(frames[:2])


@pytest.mark.parametrize("steps", [0, 5])  # cancelled before its first step, or inside the rollout
async def test_a_worker_answers_cancelled_only_to_a_cancel_the_server_asked_for(endpoint, steps):
    worker = Worker(load_taskset(SPEC, {"setup_sleep": 30}), "ipc://unused", "w1")
    worker.socket = RecordingSocket()  # type: ignore[assignment]
    payload = pack(RunRequest(data=task(), endpoint=endpoint).model_dump(mode="json"))
    for key in (b"asked", b"torn"):
        worker._handle([RUN, key, key, payload])
    jobs = list(worker.jobs.values())
    for _ in range(steps):
        await asyncio.sleep(0)
    worker._handle([CANCEL, b"asked"])
    worker.jobs[b"torn"].cancel()  # as asyncio.run does to every task when task code's KeyboardInterrupt ends the loop
    await asyncio.gather(*jobs, return_exceptions=True)
    assert worker.socket.sent == [[REPLY, b"asked"]]  # the other is the server's to rerun when the worker dies


def test_a_worker_marked_for_replacement_answers_its_other_requests_and_stops_only_after_them(unserved,
                                                                                            monkeypatch):
    sent: list[tuple[bytes, bytes]] = []
    monkeypatch.setattr(unserved, "_to_worker", lambda name, frames: sent.append((name, frames[0])) or True)
    fake_worker(unserved, b"w8", b"a", b"b")
    unserved._on_worker([b"w8", REPLACE])
    assert unserved.stats["workers_recycled"] == 1 and unserved.pool.pick() is None  # no new work for it
    assert all(r.worker == b"w8" for r in unserved.inflight.values())  # its requests stay where they run
    unserved._on_worker([b"w8", REPLY, b"a", b"x", b"x"])
    assert (b"w8", STOP) not in sent and unserved.inflight[b"b"].worker == b"w8"
    unserved._on_worker([b"w8", REPLY, b"b", b"x", b"x"])
    assert (b"w8", STOP) in sent and not unserved.inflight  # both answered, then stopped


# --- recovery: a warm spare takes a dead worker's requests; a second death waits for no fresh process ----------
@pytest.fixture
def routed(unserved, monkeypatch):
    """`unserved`, its messages to workers recorded as (worker, kind, key) instead of sent."""
    sent: list[tuple[bytes, bytes, bytes | None]] = []
    monkeypatch.setattr(unserved, "_to_worker",
                        lambda name, frames, copy=True: sent.append((name, frames[0], frames[1] if len(frames) > 1
                                                                     else None)) or True)
    unserved.sent = sent
    return unserved


def spare_worker(server: EnvServer, name: bytes) -> WorkerHandle:
    handle = fake_worker(server, name)
    handle.spare = True
    return handle


def starting_worker(server: EnvServer, name: bytes) -> WorkerHandle:
    handle = WorkerHandle(name, subprocess.Popen(["sleep", "30"]), started=time.monotonic())
    server.pool.workers[name] = handle
    return handle


def test_a_dead_workers_requests_run_at_once_on_the_spare_together(routed):
    fake_worker(routed, b"w1", b"a", b"b", b"c")
    fake_worker(routed, b"w2", b"x")
    spare = spare_worker(routed, b"s1")
    dies(routed, routed.pool.workers[b"w1"])
    routed._flush_pending()
    assert {k: r.worker for k, r in routed.inflight.items() if r.suspect} == {b"a": b"s1", b"b": b"s1", b"c": b"s1"}
    assert spare.isolating and not spare.spare and routed.pool.promoted == 1  # one of the pool now
    assert not routed.suspects and not routed.pending and routed.stats["isolated_runs"] == 1
    assert routed.pool.pick() is routed.pool.workers[b"w2"]  # new work goes on to the others meanwhile


def test_a_second_death_while_the_new_spare_starts_does_not_wait_for_it(routed):
    fake_worker(routed, b"w1", b"a", b"b")
    fake_worker(routed, b"w2", b"x", b"y")
    spare_worker(routed, b"s1")
    dies(routed, routed.pool.workers[b"w1"])
    routed._flush_pending()  # a, b on s1
    starting_worker(routed, b"s2")  # the new spare, not ready: the second death must not wait for it
    fake_worker(routed, b"w3", b"n")  # a busy worker, serving on (half the ready workers are reserved: s1)
    dies(routed, routed.pool.workers[b"w2"])
    routed._flush_pending()
    assert [list(g) for g in routed.suspects] == [[b"x", b"y"]] and not routed.pool.workers[b"w3"].isolating
    routed._on_worker([b"s1", REPLY, b"a", b"h", b"p"])
    routed._on_worker([b"s1", REPLY, b"b", b"h", b"p"])  # s1 is idle first: it takes the second group
    assert (routed.inflight[b"x"].worker, routed.inflight[b"y"].worker) == (b"s1", b"s1")
    assert not routed.pool.workers[b"s2"].ready and not routed.suspects


def test_an_idle_worker_takes_the_turn_of_a_reserved_one_still_draining(routed):
    fake_worker(routed, b"w1", b"a", b"b")
    fake_worker(routed, b"w2", b"n")
    dies(routed, routed.pool.workers[b"w1"])  # no spare: w2 is reserved to drain
    routed._flush_pending()
    assert routed.pool.workers[b"w2"].isolating and routed.suspects
    fresh = fake_worker(routed, b"w3")  # a replacement says ready before w2 drained
    routed._flush_pending()
    assert (routed.inflight[b"a"].worker, routed.inflight[b"b"].worker) == (b"w3", b"w3") and fresh.isolating
    assert not routed.pool.workers[b"w2"].isolating  # back to serving at once


async def test_a_killed_workers_requests_are_taken_over_by_the_warm_spare(endpoint):
    with running_server(size=PoolSize(min=1, spares=1)) as server:
        assert wait_for(lambda: server.pool.counts()["spare"] == 1, 30), "the spare did not start"
        [spare] = [h for h in server.pool.workers.values() if h.spare]
        async with EnvClient(server.bound) as client:
            jobs = [asyncio.create_task(client.run(task(f"sleep-1.{i}"), endpoint)) for i in range(4)]
            await asyncio.to_thread(wait_for, lambda: len(server.inflight) == 4 and not server.pending, 30)
            [worker] = [h for h in server.pool.workers.values() if h.jobs]
            os.kill(worker.proc.pid, signal.SIGKILL)
            taken = await asyncio.to_thread(  # dispatched to the spare, which was ready before the death
                wait_for, lambda: all(r.worker == spare.name for r in list(server.inflight.values())), 30)
            traces = await asyncio.wait_for(asyncio.gather(*jobs), 60)
        assert taken and all(t[0].ok for t in traces)
        assert server.stats["redispatched"] == 4 and server.pool.promoted == 1 and server.stats["isolated_runs"] == 1
        assert wait_for(lambda: server.pool.counts()["spare"] == 1, 30)  # a new one behind it
