"""Episodes on an env server: the client mirrors the in-process episode API, seats cross the wire, and a worker
killed mid-episode costs a re-dispatch, never a hang."""

import asyncio
import os
import signal

import pytest
from serve_helpers import running_server, wait_for

from tracegym import Endpoint
from tracegym.core.errors import UsageError
from tracegym.envs.evaluate import evaluate_episodes
from tracegym.envs.registry import load_taskset
from tracegym.envs.seats import Seat
from tracegym.serve import EnvClient, PoolSize
from tracegym.testing import FakeOpenAIServer, Stall


def passive(request):
    """Checks when it may, calls a bet: every hand goes to a showdown."""
    return "<think>my card is secret</think> check call"


def aggressive(request):
    return "bet call"


@pytest.fixture(scope="module")
def players():
    with FakeOpenAIServer(rule=passive, model="passive") as calm, FakeOpenAIServer(rule=aggressive,
                                                                                   model="aggressive") as bold:
        yield (Endpoint(base_url=calm.base_url, model="passive", api_key_env=None, max_retries=0),
               Endpoint(base_url=bold.base_url, model="aggressive", api_key_env=None, max_retries=0))


async def test_episodes_on_a_server_match_the_same_episodes_in_process(players):
    calm, _ = players
    taskset = load_taskset("kuhn-poker", {"num_tasks": 6})
    with running_server(spec="kuhn-poker", options={"num_tasks": 6}) as server:
        async with EnvClient(server.bound) as client:
            served = await client.evaluate_episodes(taskset, calm, rollouts=2)
            one = await client.run_episode(taskset, taskset[0], calm, episode_index=3)
    local = await evaluate_episodes(taskset, calm, rollouts=2)
    assert [(e.task_key, e.episode_index, e.outcomes, e.rewards) for e in served] == [
        (e.task_key, e.episode_index, e.outcomes, e.rewards) for e in local]
    assert all(e.ok and e.metrics["slots"] == 2 for e in served)  # check, check: showdown
    assert one.episode_index == 3 and one.traces["player_1"].member == "player_1"


async def test_a_seat_pinned_to_another_endpoint_plays_there_and_does_not_train(players):
    calm, bold = players
    taskset = load_taskset("kuhn-poker", {"num_tasks": 4})
    with running_server(spec="kuhn-poker", options={"num_tasks": 4}) as server:
        async with EnvClient(server.bound) as client:
            episodes = await client.evaluate_episodes(taskset, calm, seats={"player_1": Seat(model=bold)})
            with pytest.raises(UsageError, match="seat override for 'player_9'"):
                await client.evaluate_episodes(taskset, calm, seats={"player_9": Seat(model=bold)})
            with pytest.raises(UsageError, match="multi-agent: run episodes"):
                await client.run_rollout(taskset, taskset[0], calm)
    for episode in episodes:
        assert episode.models == {"player_0": "passive", "player_1": "aggressive"}
        assert episode.trainable == {"player_0": True, "player_1": False}
        assert [m.text for m in episode.traces["player_0"].messages][-2].endswith("player_1 bets. Your move: "
                                                                                   "call or fold?")


async def test_a_worker_killed_mid_episode_costs_a_redispatch_never_a_hang():
    with FakeOpenAIServer(rule=lambda r: Stall(0.3, then=passive(r)), model="passive") as slow:
        endpoint = Endpoint(base_url=slow.base_url, model="passive", api_key_env=None, max_retries=0)
        taskset = load_taskset("kuhn-poker", {"num_tasks": 3})
        with running_server(spec="kuhn-poker", options={"num_tasks": 3}, size=PoolSize(min=1)) as server:
            async with EnvClient(server.bound, per_request=1) as client:
                run = asyncio.create_task(client.evaluate_episodes(taskset, endpoint))
                assert await asyncio.to_thread(wait_for, lambda: len(server.inflight) == 3, 10)
                os.kill(server.pool.pids()[0], signal.SIGKILL)
                episodes = await asyncio.wait_for(run, 30)
            assert server.stats["workers_died"] == 1 and server.stats["redispatched"] == 3
    assert all(e.ok for e in episodes)
