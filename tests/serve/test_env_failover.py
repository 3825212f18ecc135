"""An env client over several env servers: requests spread by load, a lost server's requests re-sent to the others
(every rollout answered once), addresses checked at launch (duplicates, a dead one, none alive, no such host)."""

import asyncio
import contextlib
import logging
import socket

import pytest
from serve_helpers import running_server, task

import tracegym as tg
from tracegym.serve import EnvClient
from tracegym.serve.env_client import check_env_server
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.echo import Echo


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


HELD = {"setup_sleep": 5.0}
"""Each rollout holds its request long enough that all of a test's requests are out before any is answered, on a
loaded machine too."""


async def in_flight(client: EnvClient, count: int, deadline_s: float = 30.0) -> list[int]:
    """Each host's load once `count` requests are out (polled; a deadline, not a guess at how long sending takes)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while sum(h.load for h in client.hosts) < count and loop.time() < end:
        await asyncio.sleep(0.01)
    return [h.load for h in client.hosts]


async def test_a_server_stopped_mid_run_costs_no_rollout_and_none_runs_twice(endpoint):
    taskset = Echo(HELD)
    with contextlib.ExitStack() as stack:
        kept = [stack.enter_context(running_server(HELD)) for _ in range(2)]
        doomed = contextlib.ExitStack()
        lost = doomed.enter_context(running_server(HELD))
        async with EnvClient([kept[0].bound, lost.bound, kept[1].bound], per_request=1) as client:
            run = asyncio.ensure_future(client.evaluate(taskset, endpoint, num_tasks=12, concurrency=12))
            assert await in_flight(client, 12) == [4, 4, 4]  # none answered yet: each holds its request 5 s
            await asyncio.to_thread(doomed.close)
            traces = await asyncio.wait_for(run, 60)
    assert len(traces) == 12 and all(t.ok for t in traces), [t.errors for t in traces if not t.ok]
    assert len({(t.task_key, t.rollout_index) for t in traces}) == 12
    assert client.moved == 4


async def test_one_server_keeps_its_old_behaviour_a_lost_request_fails():
    async with EnvClient(free_address(), liveness_timeout=0.5) as client:
        with pytest.raises(tg.InfrastructureError, match="did not answer"):
            await client.health()
        assert client.moved == 0


async def test_the_launch_check_leaves_out_a_duplicate_and_a_dead_server_and_refuses_when_none_answers(caplog):
    dead = free_address()
    with running_server() as alive, caplog.at_level(logging.WARNING):
        await check_env_server([alive.bound, alive.bound, dead], Echo(), timeout_s=1.0)
    assert "more than once" in caplog.text and f"{dead} left out" in caplog.text
    with pytest.raises(tg.InfrastructureError, match=f"no env server answers: {dead}: "):
        await check_env_server([dead, free_address()], Echo(), timeout_s=1.0)


async def test_an_address_whose_host_does_not_resolve_is_named():
    with pytest.raises(tg.UsageError, match=r"the host 'no-such-host\.invalid' of env server address"):
        await check_env_server(["tcp://no-such-host.invalid:5555"], Echo())


async def test_a_server_of_another_taskset_among_several_is_refused_by_address(endpoint):
    with running_server() as one, running_server({"num_tasks": 3}) as other:
        async with EnvClient([one.bound, other.bound]) as client:
            with pytest.raises(tg.UsageError, match=f"env server at {other.bound} runs 'echo' with num_tasks = 3"):
                await client.run_rollout(Echo(), task(), endpoint)


async def test_an_endpoint_with_replicas_crosses_the_wire_and_workers_route_over_its_servers(server):
    a, b = (FakeOpenAIServer(rule=lambda _, name=name: name, model="m").start() for name in "ab")
    try:
        endpoint = tg.Endpoint(base_url=a.base_url, model="m", replicas=[b.base_url], api_key_env=None)
        async with EnvClient(server.bound) as client:
            traces = await client.evaluate(Echo(), endpoint, num_tasks=8, concurrency=8)
    finally:
        a.stop()
        b.stop()
    assert {t.last_reply for t in traces} == {"a", "b"} and all(t.ok for t in traces)
