"""Bounded caches in a long-running worker: model clients per endpoint, threads left behind by hung sync calls."""

import asyncio
from pathlib import Path

from serve_helpers import alive, running_server, task, wait_for, worker_pids

from tracegym import Endpoint, Timeouts
from tracegym.models.connect import make_client
from tracegym.serve import EnvClient, PoolSize
from tracegym.serve import worker as worker_module
from tracegym.serve.model_clients import ModelClients
from tracegym.serve.wire import pack
from tracegym.testing.echo import Echo

HANGING = f"{Path(__file__).parent / 'hanging_metric_tasks.py'}:HangingMetric"
ABANDONED_LIMIT = 32
MODEL_CLIENTS = 32


async def test_a_worker_keeps_a_bounded_number_of_model_clients_and_closes_those_it_drops(endpoint, monkeypatch):
    made: list = []

    def make(ep: Endpoint):
        client = make_client(ep)
        client.closed = False
        original = client.aclose

        async def aclose() -> None:
            client.closed = True
            await original()

        client.aclose = aclose
        made.append(client)
        return client

    monkeypatch.setattr(worker_module, "make_model", make)
    worker = worker_module.Worker(Echo({}), "inproc://unused", "w-test")
    for n in range(MODEL_CLIENTS + 8):
        ep = endpoint.model_copy(update={"timeout": 60.0 + n})  # a distinct endpoint each time
        payload = pack({"data": task("hello").model_dump(mode="json"), "endpoint": ep.model_dump(mode="json")})
        [trace] = await worker._traces(payload)
        assert not trace["errors"]
    assert len(worker.models) == MODEL_CLIENTS
    assert [c.closed for c in made] == [True] * 8 + [False] * MODEL_CLIENTS  # the least recently used went


async def test_a_worker_whose_abandoned_threads_pass_the_limit_is_replaced_after_its_requests_finish(endpoint):
    with running_server(spec=HANGING, size=PoolSize(min=1)) as server:
        [old] = worker_pids(server)
        async with EnvClient(server.bound) as client:
            traces = await client.run(task("hang"), endpoint, rollout_indices=list(range(ABANDONED_LIMIT + 1)),
                                      timeouts=Timeouts(scoring=0.2))
            assert all(t.errors and t.errors[0].kind == "timeout" for t in traces)
            replaced = await asyncio.to_thread(
                wait_for, lambda: server.stats["workers_recycled"] == 1 and len(worker_pids(server)) == 1
                and worker_pids(server) != [old], 20)
            assert replaced, server.health()
            assert await asyncio.to_thread(wait_for, lambda: not alive(old), 10)
            [trace] = await client.run(task("fine"), endpoint)
            assert trace.ok


class Closing:
    """A model client that records whether it was closed."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint, self.closed = endpoint, False

    async def aclose(self) -> None:
        self.closed = True


async def test_a_model_client_dropped_while_a_rollout_uses_it_is_closed_when_that_rollout_ends(endpoint):
    clients = ModelClients(Closing, limit=1)
    first, second = endpoint, endpoint.model_copy(update={"timeout": 1.0})
    async with clients.use(first) as busy:
        async with clients.use(second) as other:
            assert not busy.closed  # evicted, but still in use
        assert not other.closed and len(clients) == 1
    assert busy.closed
    async with clients.use(second) as again:
        assert again is other


class SlowClosing(Closing):
    """A model client whose close takes until `gate` opens (so an eviction awaits, and others run meanwhile)."""

    gate: asyncio.Event

    async def aclose(self) -> None:
        self.closed = True
        await self.gate.wait()


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0)


async def test_a_new_client_is_not_closed_by_another_new_endpoint_while_its_own_eviction_awaits(endpoint):
    SlowClosing.gate = asyncio.Event()
    made: list[SlowClosing] = []
    clients = ModelClients(lambda ep: made.append(SlowClosing(ep)) or made[-1], limit=1)
    endpoints = [endpoint.model_copy(update={"timeout": 1.0 + n}) for n in range(3)]
    async with clients.use(endpoints[0]):
        pass
    leave = asyncio.Event()
    used: list[bool] = []

    async def use(ep: Endpoint) -> None:
        async with clients.use(ep) as model:
            used.append(model.closed)
            await leave.wait()

    a = asyncio.create_task(use(endpoints[1]))
    await until(lambda: made[0].closed)  # a evicts the first client and awaits its close
    b = asyncio.create_task(use(endpoints[2]))
    await until(lambda: len(made) == 3 and (made[1].closed or used))  # b evicted a's client, or is using its own
    SlowClosing.gate.set()
    await until(lambda: len(used) == 2)
    assert used == [False, False], "a client was closed while handed out"
    leave.set()
    await asyncio.gather(a, b)
    assert made[1].closed and not made[2].closed  # a's client went once a was done with it
